"""transformers.Trainer + TracealyzeCallback on transformers' own GPT-2 (small config):
the recorded steps, losses, learning rates and gradient norms are the Trainer's own, with
gradient accumulation, clipping, a scheduler and evaluation in the middle of training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from rec_helpers import FAST, events, run_json, steps_by_number
from reference import GradReference, assert_close, grad_norms

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from tracealyze.recorder.integrations.hf import TracealyzeCallback  # noqa: E402

from tests.matrix.models import hf_gpt2, token_batches  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 96, seed: int = 0) -> None:
        draw = token_batches(seed, 1)
        self.rows = [draw(i)[0] for i in range(n)]
        self.fetched: list[int] = []

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        self.fetched.append(i)  # (the order the Trainer's loader asked for samples)
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


class Logs(transformers.TrainerCallback):
    """The Trainer's own per-step logs (logging_steps=1) and, at each optimizer step, the
    reference gradient norms frozen before clipping."""

    def __init__(self, ref: GradReference | None = None) -> None:
        self.train: list[dict[str, Any]] = []
        self.evals = 0
        self.ref = ref

    def on_substep_end(self, *a: Any, **k: Any) -> None:
        pass

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **k: Any) -> None:
        if logs and "loss" in logs:
            self.train.append({"step": state.global_step - 1, **logs})
        if logs and "eval_loss" in logs:
            self.evals += 1


def _args(out: Path, **kw: Any) -> Any:
    base = dict(output_dir=str(out), max_steps=10, per_device_train_batch_size=4,
                gradient_accumulation_steps=2, learning_rate=2e-3, warmup_steps=3,
                lr_scheduler_type="linear", max_grad_norm=0.5, logging_steps=1,
                report_to=[], use_cpu=True, save_strategy="no", seed=0,
                eval_strategy="steps", eval_steps=4, per_device_eval_batch_size=8)
    base.update(kw)
    return transformers.TrainingArguments(**base)


class PreClip(transformers.TrainerCallback):
    """Freezes the reference norms at each optimizer step (on_substep_end does not run on
    the last micro-batch; clipping comes after autograd's hooks, so the reference taken by
    the hooks is before clipping)."""

    def __init__(self, ref: GradReference) -> None:
        self.ref = ref

    def on_pre_optimizer_step(self, *a: Any, **k: Any) -> None:
        self.ref.snapshot()


def test_trainer_records_the_trainers_own_values(tmp_path: Path) -> None:
    model = hf_gpt2(0)
    ref = GradReference(model)
    logs = Logs()
    cb = TracealyzeCallback(**FAST)
    train = Tokens()
    trainer = transformers.Trainer(model=model, args=_args(tmp_path / "out"),
                                   train_dataset=train, eval_dataset=Tokens(16, seed=1),
                                   callbacks=[cb, logs, PreClip(ref)])
    trainer.train()
    run = tmp_path / "out" / "tracealyze"
    steps = steps_by_number(run)
    # one recorded step per optimizer step; evaluation (3 times) is not training
    assert sorted(steps) == list(range(10)) and logs.evals >= 2
    assert run_json(run)["status"] == "completed"
    assert run_json(run)["data"]["batch_size"] == 4  # per_device_train_batch_size
    # what the run was configured to do: TrainingArguments and the model's config
    hp = run_json(run)["hparams"]
    assert hp["args.learning_rate"] == 2e-3 and hp["args.gradient_accumulation_steps"] == 2
    assert hp["args.lr_scheduler_type"] == "linear"  # (an enum, kept as its value)
    assert hp["model.n_layer"] == model.config.n_layer
    assert hp["model.model_type"] == "gpt2"
    assert all(v == "<redacted>" for k, v in hp.items()
               if k.endswith("_token") and isinstance(v, str))
    assert len(logs.train) == 10
    for log in logs.train:
        s = steps[log["step"]]
        assert_close(s["loss"], log["loss"], 1e-5, f"loss at {log['step']}")
        assert_close(s["lr"], log["learning_rate"], 1e-9, f"lr at {log['step']}")
        # the Trainer's grad_norm is clip_grad_norm_'s total, before clipping
        assert_close(s["grad_norm"], log["grad_norm"], 1e-5, f"grad_norm at {log['step']}")
        assert s["grad_clip_max"] == 0.5
        assert s["data_wait_s"] is not None and s["data_wait_s"] >= 0
    assert max(log["grad_norm"] for log in logs.train) > 0.5  # clipping really happened
    per_param = grad_norms(run)
    for i, expected in enumerate(ref.steps):
        got = per_param[i]
        assert set(got) == set(expected)
        for name, v in expected.items():
            assert_close(got[name], v, 1e-4, f"{name} at step {i}")
    assert not events(run, "recorder_error")
    # each step's samples: the two micro-batches of 4 the Trainer's sampler drew, in order
    ids = [steps[i]["sample_ids"] for i in range(10)]
    assert ids == [train.fetched[8 * i: 8 * i + 8] for i in range(10)]


def test_default_run_dir_is_not_overwritten_by_a_second_training(tmp_path: Path) -> None:
    for _ in range(2):
        cb = TracealyzeCallback(**FAST)
        transformers.Trainer(model=hf_gpt2(0), args=_args(tmp_path / "out", max_steps=2,
                                                          eval_strategy="no"),
                             train_dataset=Tokens(16), callbacks=[cb]).train()
    first, second = tmp_path / "out" / "tracealyze", tmp_path / "out" / "tracealyze-2"
    assert sorted(steps_by_number(first)) == [0, 1] == sorted(steps_by_number(second))
    assert run_json(first)["run_id"] != run_json(second)["run_id"]


def test_passing_the_accelerated_optimizer_to_a_recorder_works(tmp_path: Path) -> None:
    """The bug a user hit: Recorder(optimizer=<AcceleratedOptimizer>) raised AttributeError
    and left a run dir marked running that refused the retry."""
    from accelerate import Accelerator
    from tracealyze.recorder import Recorder

    model = hf_gpt2(0)
    acc = Accelerator(cpu=True)
    opt = acc.prepare(torch.optim.AdamW(model.parameters(), lr=1e-3))
    with Recorder(tmp_path / "run", model=model, optimizer=opt, **FAST) as rec:
        ids = Tokens(4)[0]["input_ids"][None]
        for _ in range(2):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
            rec.step()
    assert all(s["grad_norm"] > 0 for s in steps_by_number(tmp_path / "run").values())


def test_bad_configuration_is_refused_when_the_callback_is_made() -> None:
    with pytest.raises(ValueError, match="preset"):
        TracealyzeCallback(preset="fastest")
    with pytest.raises(ValueError, match="grad_norm_every"):
        TracealyzeCallback(grad_norm_every=-1)
    with pytest.raises(ValueError, match="run_dir"):
        TracealyzeCallback(run_dir=3)  # type: ignore[arg-type]


CRASHING = '''
import sys, torch, transformers
sys.path.insert(0, {root!r})
from tests.matrix.models import hf_gpt2, token_batches
from tracealyze.recorder.integrations.hf import TracealyzeCallback

class Boom(transformers.TrainerCallback):
    def on_step_begin(self, args, state, control, **kw):
        if state.global_step == 3:
            raise RuntimeError("boom at step 3")

draw = token_batches(0, 1)
ds = [{{"input_ids": r, "labels": r}} for r in (draw(i)[0] for i in range(32))]
args = transformers.TrainingArguments(output_dir=sys.argv[1], max_steps=6,
    per_device_train_batch_size=4, report_to=[], use_cpu=True, save_strategy="no",
    disable_tqdm=True)
transformers.Trainer(model=hf_gpt2(0), args=args, train_dataset=ds,
                     callbacks=[TracealyzeCallback(system_interval_s=0), Boom()]).train()
'''


def test_an_exception_in_training_leaves_the_run_crashed(tmp_path: Path) -> None:
    import subprocess
    import sys

    from rec_helpers import subprocess_env

    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", CRASHING.format(root=root),
                          str(tmp_path / "out")], capture_output=True, text=True,
                         timeout=240, env=subprocess_env())
    assert out.returncode == 1 and "boom at step 3" in out.stderr
    run = tmp_path / "out" / "tracealyze"
    assert run_json(run)["status"] == "crashed"
    assert sorted(steps_by_number(run)) == [0, 1, 2]
    assert any("boom at step 3" in (e["message"] or "") for e in events(run, "exception"))
