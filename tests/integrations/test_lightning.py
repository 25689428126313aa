"""Lightning + TracealyzeCallback on the matrix's nanoGPT: the recorded steps, losses,
learning rates and gradient norms are those computed inside Lightning's training step, with
gradient accumulation, clipping, a scheduler and validation in the middle of training. The
optimizer-hook recipe got every norm one step late here (Lightning steps the optimizer
before its closure runs the backward)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from rec_helpers import FAST, events, run_json, steps_by_number
from reference import assert_close, grad_norms

L = pytest.importorskip("lightning.pytorch")

from tracealyze.recorder.integrations.lightning import TracealyzeCallback  # noqa: E402

from tests.matrix.models import (  # noqa: E402
    MODELS,
    NanoGPT,
    nanogpt_adamw,
    nanogpt_loss,
    token_batches,
)


class TokenData(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int = 0) -> None:
        draw = token_batches(seed, 1)
        self.rows = [draw(i)[0] for i in range(n)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.rows[i]


class GPTModule(L.LightningModule):
    """A matrix model in a LightningModule (nanoGPT by default); keeps the in-step
    reference values."""

    def __init__(self, accumulate: int, spec: str | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()  # (what the callback records as model.*)
        self.spec = MODELS[spec] if spec else None
        self.model = self.spec.build(0) if self.spec else NanoGPT(0)
        self.accumulate = accumulate
        self.micro_losses: list[float] = []
        self.ref_loss: list[float] = []
        self.ref_norms: list[dict[str, float]] = []
        self.ref_lr: list[float] = []

    def _loss(self, batch: Any) -> torch.Tensor:
        return self.spec.loss(self.model, batch) if self.spec else nanogpt_loss(self.model, batch)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.micro_losses.append(float(loss))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch))

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        # after the last micro-batch's backward, before Lightning clips
        self.ref_norms.append({f"model.{n}": float(p.grad.double().norm())
                               for n, p in self.model.named_parameters() if p.grad is not None})
        self.ref_loss.append(sum(self.micro_losses) / len(self.micro_losses))
        self.micro_losses = []
        self.ref_lr.append(optimizer.param_groups[0]["lr"])

    def configure_optimizers(self) -> Any:
        opt = (self.spec.optimizer(self.model, self.spec.lr * 3) if self.spec
               else nanogpt_adamw(self.model, 3e-3))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


CLIP = 0.1
"""Under every model's first gradient norms (BERT's classifier starts at 0.12-0.15), so the
clipping happens and the norms recorded can be told from the clipped ones."""


def _trainer(root: Path, cb: Any, **kw: Any) -> Any:
    base = dict(max_steps=8, accumulate_grad_batches=2, gradient_clip_val=CLIP,
                val_check_interval=4, limit_val_batches=2, default_root_dir=str(root),
                accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False)
    base.update(kw)
    return L.Trainer(callbacks=[cb], **base)


class Batches(torch.utils.data.Dataset):
    """A matrix model's own batches, one per item (loaded with batch_size=None)."""

    def __init__(self, spec: str, n: int, seed: int = 0) -> None:
        draw = MODELS[spec].data(seed)
        self.items = [draw(i) for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


@pytest.mark.parametrize("spec", sorted(MODELS))
def test_lightning_records_the_values_of_its_training_step(tmp_path: Path, spec: str) -> None:
    module = GPTModule(accumulate=2, spec=spec)
    cb = TracealyzeCallback(hparams={"data": {"source": "matrix"}}, **FAST)
    loader = torch.utils.data.DataLoader(Batches(spec, 16), batch_size=None)
    val = torch.utils.data.DataLoader(Batches(spec, 2, seed=1), batch_size=None)
    _trainer(tmp_path, cb).fit(module, loader, val)
    run = tmp_path / "tracealyze"
    steps = steps_by_number(run)
    assert sorted(steps) == list(range(8))  # optimizer steps, validation not counted
    assert run_json(run)["status"] == "completed"
    # the module's save_hyperparameters(), the trainer's settings, the user's own
    hp = run_json(run)["hparams"]
    assert (hp["model.accumulate"], hp["model.spec"]) == (2, spec)
    assert (hp["trainer.max_steps"], hp["trainer.accumulate_grad_batches"],
            hp["trainer.gradient_clip_val"]) == (8, 2, CLIP)
    assert hp["data.source"] == "matrix"
    per_param = grad_norms(run)
    clipped = 0
    for i in range(8):
        s = steps[i]
        assert_close(s["loss"], module.ref_loss[i], 1e-5, f"loss at {i}")
        assert_close(s["lr"], module.ref_lr[i], 1e-9, f"lr at {i}")
        total = math.sqrt(sum(v * v for v in module.ref_norms[i].values()))
        assert_close(s["grad_norm"], total, 1e-4, f"grad_norm at {i}")
        clipped += total > CLIP
        assert set(per_param[i]) == set(module.ref_norms[i])
        for name, v in module.ref_norms[i].items():
            assert_close(per_param[i][name], v, 1e-4, f"{name} at {i}")
        assert s["data_wait_s"] is not None
    assert clipped >= 1  # the norms recorded are from before clipping
    assert not events(run, "recorder_error")
    # training_step calls self.model, never the LightningModule: the structure probe still
    # reads that first training pass (it used to wait for it, hooked, the whole run)
    (structure,) = events(run, "model_structure")
    assert json.loads(structure["details"])["not_called"] == []


def test_an_exception_in_training_closes_the_run_as_crashed(tmp_path: Path) -> None:
    class Boom(GPTModule):
        def training_step(self, ids: torch.Tensor, batch_idx: int) -> torch.Tensor:
            if self.global_step == 3:
                raise RuntimeError("boom at step 3")
            return super().training_step(ids, batch_idx)

    loader = torch.utils.data.DataLoader(TokenData(64), batch_size=4)
    with pytest.raises(RuntimeError, match="boom"):
        _trainer(tmp_path, TracealyzeCallback(**FAST), accumulate_grad_batches=1,
                 limit_val_batches=0).fit(Boom(accumulate=1), loader)
    run = tmp_path / "tracealyze"
    assert run_json(run)["status"] == "crashed"
    assert sorted(steps_by_number(run)) == [0, 1, 2]
    assert any("boom at step 3" in (e["message"] or "") for e in events(run, "exception"))


def test_pytorch_lightning_trainer_accepts_the_same_callback(tmp_path: Path) -> None:
    pl = pytest.importorskip("pytorch_lightning")

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, _i: int) -> torch.Tensor:
            x, y = batch
            return ((self.net(x) - y) ** 2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    pl.Trainer(max_steps=5, accelerator="cpu", logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False,
               default_root_dir=str(tmp_path), callbacks=[TracealyzeCallback(**FAST)]).fit(
        Tiny(), torch.utils.data.DataLoader(data, batch_size=4))
    steps = steps_by_number(tmp_path / "tracealyze")
    assert sorted(steps) == list(range(5)) and all(s["grad_norm"] > 0 for s in steps.values())


class Indexed(torch.utils.data.Dataset):
    """``(x, y, i)``: a batch names its own samples (the ground truth of the sample ids,
    whichever process loaded it)."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        return self.x[i], self.y[i], i


class IdsModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.seen: list[list[int]] = []  # each micro-batch's samples, in training order

    def training_step(self, batch: Any, _i: int) -> torch.Tensor:
        x, y, idx = batch
        self.seen.append(idx.tolist())
        return ((self.net(x) - y) ** 2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("workers, persistent, accumulate", [
    (0, False, 1), (0, False, 2), (2, False, 1), (2, True, 2)])
def test_lightning_records_the_samples_of_each_step(tmp_path: Path, workers: int,
                                                     persistent: bool, accumulate: int) -> None:
    """The fit loop makes its first loader iterator (and a worker iterator its first
    batches) before any callback runs: those batches go unnamed, never misnamed; the rest
    of the first epoch and every later epoch (shuffled anew) carry the samples trained on."""
    module = IdsModule()
    loader = torch.utils.data.DataLoader(Indexed(40), batch_size=4, shuffle=True,
                                         num_workers=workers, persistent_workers=persistent)
    _trainer(tmp_path, TracealyzeCallback(**FAST), max_steps=25 // accumulate,
             accumulate_grad_batches=accumulate, gradient_clip_val=None,
             limit_val_batches=0).fit(module, loader)
    steps = steps_by_number(tmp_path / "tracealyze")
    assert len(steps) == 25 // accumulate
    trained = [[i for micro in module.seen[accumulate * s: accumulate * (s + 1)] for i in micro]
               for s in range(len(steps))]
    recorded = [steps[s]["sample_ids"] for s in range(len(steps))]
    named = [s for s, ids in enumerate(recorded) if ids is not None]
    assert all(recorded[s] == trained[s] or (  # a step whose first micro-batch was drawn
        accumulate > 1 and s == named[0] and recorded[s] == trained[s][4:])  # before
        for s in named)
    # unnamed: only the batches drawn before training started (the fetcher's one, and two
    # per worker sent ahead), all at the start
    unnamed = len(steps) - len(named)
    assert unnamed * accumulate <= 1 + 2 * workers and named == list(range(unnamed, len(steps)))
    second_epoch = trained[10 // accumulate:20 // accumulate]
    assert sorted(i for step in second_epoch for i in step) == list(range(40))
