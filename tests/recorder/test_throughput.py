"""Throughput and MFU on real architectures (a nanoGPT-style GPT, a ResNet, transformers'
GPT-2): samples/s and tokens/s from the batches' shapes, model FLOPs equal to an
independent FlopCounterMode count of one training step, MFU against the peak given, and
the rules around them (tokens=, gradient accumulation, other batch shapes, no peak)."""

from __future__ import annotations

import copy
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import torch
from rec_helpers import FAST
from torch.utils.flop_counter import FlopCounterMode
from tracealyze.recorder import Recorder
from tracealyze.recorder.training.throughput import peak_for, tokens_of

from tests.matrix.models import SEQ, VOCAB, NanoGPT, ResNet, nanogpt_loss

PEAK = 2e12


def _steps(run: Path) -> list[dict]:
    rows = ds.dataset(run / "steps", partitioning="hive").to_table().to_pylist()
    return sorted(rows, key=lambda r: r["step"])


def _reference_flops(model: torch.nn.Module, loss_fn, batch) -> int:
    """FlopCounterMode around one training step of a copy of the model (as a user would)."""
    m = copy.deepcopy(model)
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    with FlopCounterMode(display=False) as counter:
        loss_fn(m, batch).backward()
        opt.step()
    return counter.get_total_flops()


def _train(run: Path, model, loss_fn, batches, **knobs) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with Recorder(run, model=model, optimizer=opt, **{**FAST, **knobs}) as rec:
        for batch in rec.wrap_loader(batches):
            loss = loss_fn(model, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)


def test_gpt_tokens_flops_and_mfu(tmp_path: Path) -> None:
    model = NanoGPT(seed=0)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, VOCAB, (8, SEQ), generator=g) for _ in range(8)]
    want = _reference_flops(model, nanogpt_loss, batches[0])
    _train(tmp_path / "run", model, nanogpt_loss, batches, peak_flops=PEAK)
    rows = _steps(tmp_path / "run")
    assert len(rows) == 8
    for r in rows:
        assert r["samples_per_s"] == pytest.approx(8 / r["duration_s"])
        assert r["tokens_per_s"] == pytest.approx(8 * SEQ / r["duration_s"])
    counted = [r for r in rows if r["flops"] is not None]
    assert counted and counted[0]["step"] == 1  # counted on the second step, then known
    assert all(r["flops"] == want for r in counted) and len(counted) == 7
    for r in counted:
        assert r["mfu"] == pytest.approx(want / r["duration_s"] / PEAK)


def test_resnet_counts_convolutions_and_has_no_tokens(tmp_path: Path) -> None:
    model = ResNet(seed=0)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 8, (16,), generator=g))
               for _ in range(6)]

    def loss_fn(m, b):
        return torch.nn.functional.cross_entropy(m(b[0]), b[1])

    want = _reference_flops(model, loss_fn, batches[0])
    _train(tmp_path / "run", model, loss_fn, batches)
    rows = _steps(tmp_path / "run")
    assert all(r["tokens_per_s"] is None for r in rows)
    assert rows[3]["samples_per_s"] == pytest.approx(16 / rows[3]["duration_s"])
    assert rows[3]["flops"] == want > 0
    assert all(r["mfu"] is None for r in rows)  # a CPU: no peak known, none given


def test_tokens_argument_accumulation_and_other_shapes(tmp_path: Path) -> None:
    model = NanoGPT(seed=1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    with Recorder(tmp_path / "run", model=model, optimizer=opt, **FAST) as rec:
        for step in range(6):
            length = SEQ if step < 4 else SEQ // 2  # shorter sequences from step 4
            for _micro in range(2):  # gradient accumulation: two batches a step
                ids = torch.randint(0, VOCAB, (4, length), generator=g)
                rec.data_wait_ended(0.0, ids)
                nanogpt_loss(model, ids).backward()
            opt.step()
            opt.zero_grad()
            rec.step(tokens=50 if step == 5 else None)
    rows = _steps(tmp_path / "run")
    assert rows[2]["samples_per_s"] == pytest.approx(8 / rows[2]["duration_s"])
    assert rows[2]["tokens_per_s"] == pytest.approx(8 * SEQ / rows[2]["duration_s"])
    assert rows[5]["tokens_per_s"] == pytest.approx(50 / rows[5]["duration_s"])
    full = rows[2]["flops"]
    # the shorter batches were not counted: scaled from the count by their tokens
    assert rows[4]["flops"] == pytest.approx(full * (8 * (SEQ // 2)) / (8 * SEQ))


def test_hf_gpt2_batch_dict(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from tests.matrix.models import hf_gpt2

    model = hf_gpt2(0)
    g = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(0, VOCAB, (4, SEQ), generator=g),
                "attention_mask": torch.ones(4, SEQ, dtype=torch.int64)} for _ in range(5)]

    def loss_fn(m, b):
        return m(input_ids=b["input_ids"], labels=b["input_ids"]).loss

    want = _reference_flops(model, loss_fn, batches[0])
    _train(tmp_path / "run", model, loss_fn, batches, peak_flops=PEAK)
    rows = _steps(tmp_path / "run")
    assert rows[3]["tokens_per_s"] == pytest.approx(4 * SEQ / rows[3]["duration_s"])
    assert rows[3]["flops"] == want


def test_peak_table_and_token_shapes() -> None:
    assert peak_for("NVIDIA H100 80GB HBM3", "half") == 989.4e12
    assert peak_for("NVIDIA H100 PCIe", "half") == 756e12
    assert peak_for("NVIDIA A100-SXM4-80GB", "tf32") == 156e12
    assert peak_for("AMD Instinct MI300X", "half") == 1307.4e12
    assert peak_for("NVIDIA GeForce RTX 4090", "half") is None and peak_for(None, "fp32") is None
    ids = torch.zeros(4, 32, dtype=torch.int64)
    assert tokens_of(ids) == 128 and tokens_of((ids, ids)) == 128
    assert tokens_of({"input_ids": ids, "labels": ids}) == 128
    assert tokens_of(torch.zeros(4, 32)) is None  # floats are not token ids
    assert tokens_of((torch.zeros(4, 3, 8, 8), torch.zeros(4, dtype=torch.int64))) is None


def test_compare_names_a_throughput_drop(tmp_path: Path) -> None:
    """The same model fed an eighth of the tokens per step (steps paced by a 30 ms loader,
    so that a loaded machine's jitter stays small against the step): tokens/s is a
    significant regression in compare."""
    import time

    from tracealyze.analyzer.compare.runs import compare_runs

    def run(name: str, length: int) -> Path:
        model = NanoGPT(seed=0)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(0)
        with Recorder(tmp_path / name, model=model, optimizer=opt, **FAST) as rec:
            for _ in range(60):
                time.sleep(0.03)
                ids = torch.randint(0, VOCAB, (8, length), generator=g)
                rec.data_wait_ended(0.03, ids)
                loss = nanogpt_loss(model, ids)
                opt.zero_grad()
                loss.backward()
                opt.step()
                rec.step(loss=loss)
        return tmp_path / name

    r = compare_runs(run("a", SEQ), run("b", 2))
    m = {x["name"]: x for x in r["metrics"]}
    assert m["tokens_per_s"]["significant"], m["tokens_per_s"]
    assert m["tokens_per_s"]["better"] == "higher"
    assert m["tokens_per_s"]["new"] < 0.25 * m["tokens_per_s"]["base"]
    assert "tokens_per_s" in r["regressions"]


class _AttentionPool(torch.nn.Module):
    """A learned query expanded over the batch into nn.MultiheadAttention (Set Transformer's
    pooling by multi-head attention)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Linear(3, 16)
        self.query = torch.nn.Parameter(torch.randn(1, 1, 16))
        self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        q = self.query.expand(x.shape[0], -1, -1)
        return self.head(self.attn(q, h, h, need_weights=False)[0][:, 0])


@pytest.mark.parametrize("where", ["after_step", "before_step_end"])
def test_an_evaluation_between_steps_runs_and_the_training_step_is_counted(tmp_path: Path,
                                                                            where: str) -> None:
    """Under no_grad, torch's FlopCounterMode fails on an expanded parameter fed to a module
    ("Expected gradient function to be set"): an evaluation the loop runs after rec.step()
    must not run under the count (it stopped a held-out script's training at step 0). The
    training forward and backward of the counted step are still counted; an evaluation
    inside the counted step (after the update, before rec.step()) ends its count unfinished
    instead."""
    model = _AttentionPool()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(8, 5, 3, generator=g) for _ in range(6)]
    with Recorder(tmp_path / "run", model=model, optimizer=opt, **FAST) as rec:
        for x in xs:
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if where == "after_step":
                rec.step(loss=loss)
            with torch.no_grad():  # the evaluation
                model(x[:2])
            if where == "before_step_end":
                rec.step(loss=loss)
    rows = _steps(tmp_path / "run")
    assert len(rows) == 6
    counted = [r["flops"] for r in rows if r["flops"] is not None]
    if where == "after_step":
        assert counted and all(f > 0 for f in counted)
    else:
        assert not counted
