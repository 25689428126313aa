"""Recorder API and what it records: tables per preset, run.json, step pairing, gradient
accumulation, metrics, watch, events, loader timing, odd values, compile, NaN tracing, AMP,
configuration errors."""

from __future__ import annotations

import gzip
import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from rec_helpers import (
    DESIGN_MINIMUM,
    FAST,
    TABLE_NAMES,
    batches,
    events,
    loss_fn,
    part_files,
    rows,
    run_json,
    steps_by_number,
    tiny_model,
    train,
)
from torch import nn
from tracealyze.recorder import PRESETS, Recorder, RecorderConfig
from tracealyze.recorder.write.schema import TABLES

# DESIGN.md's minimum columns; every table also has rank.
PARAM_NAMES = ["0.weight", "0.bias", "2.weight", "2.bias"]


def grad_total_norm(model: nn.Module) -> float:
    gs = [p.grad.detach().double().reshape(-1) for p in model.parameters() if p.grad is not None]
    return float(torch.cat(gs).norm()) if gs else math.nan


def stats_rows(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in rows(run_dir, "tensor_stats") if r["kind"] == kind]


def full_row(r: dict[str, Any]) -> bool:
    return r["absmax"] is not None


# ------------------------------------------------------------------------------- presets
@pytest.mark.parametrize("preset", PRESETS)
def test_preset_tables(run_dir: Path, preset: str) -> None:
    n = 12
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    # Preset knobs stay as they are, except: no profiler window (slow, separate test), a
    # short flush, and a fast system sampler so its table fills during a short run.
    knobs = dict(flush_interval_s=0.05, profile_start=0, profile_every=0,
                 system_interval_s=0.05)
    with Recorder(run_dir, model=model, optimizer=opt, preset=preset, **knobs) as rec:
        for x, y in batches(n):
            loss = loss_fn(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss, acc=1.0)
        time.sleep(0.3)  # a few system samples
    cfg = RecorderConfig.from_preset(preset, **knobs)

    # Every table that has rows carries exactly the recorder's schema, which covers the
    # DESIGN minimum.
    for table in TABLE_NAMES:
        for f in part_files(run_dir, table):
            schema = pq.read_schema(f)
            assert schema.names == TABLES[table].names, (table, f)
            assert set(DESIGN_MINIMUM.get(table, ())) <= set(schema.names)
            assert "rank" not in schema.names  # the rank=<r> folder is the partition

    steps = steps_by_number(run_dir)
    assert sorted(steps) == list(range(n))
    assert all(s["rank"] == 0 and s["lr"] == 0.05 for s in steps.values())
    # Gradient norms (and the nonfinite count derived from them) at their cadence only.
    normed = [s for i, s in steps.items() if i % cfg.grad_norm_every == 0]
    assert all(s["grad_norm"] is not None and s["grad_norm"] > 0 for s in normed)
    assert all(s["nonfinite_grads"] == 0 for s in normed)
    assert all(s["grad_norm"] is None and s["nonfinite_grads"] is None
               for i, s in steps.items() if i % cfg.grad_norm_every)
    assert all(s["loss_scale"] is None and s["amp_skipped"] is None for s in steps.values())
    assert all(s["duration_s"] >= 0 for s in steps.values())
    times = [steps[i]["time"] for i in range(n)]
    assert times == sorted(times)
    assert [(r["step"], r["name"], r["value"]) for r in rows(run_dir, "metrics")] == [
        (i, "acc", 1.0) for i in range(n)]

    grad = stats_rows(run_dir, "grad")
    norm_only = [r for r in grad if not full_row(r)]
    full = [r for r in grad if full_row(r)]
    exp_full_steps = [s for s in range(n) if cfg.tensor_stats_every
                      and s % cfg.tensor_stats_every == 0]
    assert sorted({r["step"] for r in full}) == exp_full_steps
    if cfg.store_grad_norms:
        # One row per parameter per step: full stats where due, else the cheap norm only.
        assert sorted((r["step"], r["name"]) for r in grad) == sorted(
            (s, p) for s in range(n) for p in PARAM_NAMES)
        for r in norm_only:
            assert r["norm"] > 0
            assert all(r[c] is None for c in ("absmax", "mean", "std", "min", "max",
                                              "zero_frac", "nonfinite"))
    else:
        assert norm_only == []
    for r in full:
        assert r["numel"] == dict(model.named_parameters())[r["name"]].numel()
        assert r["nonfinite"] == 0 and r["min"] <= r["mean"] <= r["max"]
        assert r["absmax"] == max(abs(r["min"]), abs(r["max"]))
    exp_param_steps = [s for s in range(n) if cfg.param_stats_every
                       and s % cfg.param_stats_every == 0]
    assert sorted({r["step"] for r in stats_rows(run_dir, "param")}) == exp_param_steps
    exp_update_steps = [s for s in range(n) if cfg.update_ratio_every
                        and s % cfg.update_ratio_every == 0]
    upd = stats_rows(run_dir, "update")
    assert sorted({r["step"] for r in upd}) == exp_update_steps
    for r in upd:
        assert r["ratio"] is not None and 0 < r["ratio"] < 1 and r["mean"] is None
    exp_act_steps = [s for s in range(n) if cfg.activation_stats_every
                     and s % cfg.activation_stats_every == 0]
    act = stats_rows(run_dir, "activation")
    assert sorted({r["step"] for r in act}) == exp_act_steps
    if act:
        # Module paths from named_modules, in forward-completion (post) order.
        first = sorted((r for r in act if r["step"] == 0), key=lambda r: r["seq"])
        # Post-order; the root Sequential returns its last child's output tensor, which was
        # just recorded, so it gets no duplicate row.
        assert [r["name"] for r in first] == ["0", "1", "2"]

    mem = rows(run_dir, "memory")
    assert [r["step"] for r in mem] == [s for s in range(n) if s % cfg.memory_every == 0]
    assert all(r["rss_bytes"] > 10_000_000 for r in mem)
    assert all(r["cuda_allocated_bytes"] is None for r in mem)  # CPU run
    sysrows = rows(run_dir, "system")
    assert sysrows, "system sampler wrote nothing"
    assert all(0 <= r["mem_percent"] <= 100 and r["gpu_util"] is None for r in sysrows)

    meta = run_json(run_dir)
    assert meta["status"] == "completed" and meta["preset"] == preset
    assert meta["knobs"] == cfg.to_json()
    assert events(run_dir, "recorder_error") == []


def test_knob_overrides_apply(run_dir: Path, model_opt: Any) -> None:
    model, opt = model_opt
    with Recorder(run_dir, model=model, optimizer=opt, preset="minimal", tensor_stats_every=3,
                  store_grad_norms=True, grad_norm_every=1, memory_every=0, **FAST) as rec:
        train(rec, model, opt, batches(7))
    grad = stats_rows(run_dir, "grad")
    assert sorted({r["step"] for r in grad if full_row(r)}) == [0, 3, 6]
    assert sorted({r["step"] for r in grad}) == list(range(7))
    assert rows(run_dir, "memory") == []
    knobs = run_json(run_dir)["knobs"]
    assert knobs["tensor_stats_every"] == 3 and knobs["memory_every"] == 0
    assert knobs["grad_norm_every"] == 1  # minimal's own default is 10


def test_grad_norm_every_zero_leaves_totals_null(run_dir: Path, model_opt: Any) -> None:
    model, opt = model_opt
    with Recorder(run_dir, model=model, optimizer=opt, grad_norm_every=0, **FAST) as rec:
        train(rec, model, opt, batches(3))
    assert [s["grad_norm"] for s in steps_by_number(run_dir).values()] == [None] * 3
    assert [s["nonfinite_grads"] for s in steps_by_number(run_dir).values()] == [None] * 3


# ------------------------------------------------------------------------- run.json, parts
def test_run_json_fields_and_status_transition(run_dir: Path, model_opt: Any) -> None:
    model, opt = model_opt
    rec = Recorder(run_dir, model=model, optimizer=opt, **FAST)
    running = run_json(run_dir)
    assert running["status"] == "running" and running["ended"] is None
    train(rec, model, opt, batches(3))
    rec.close()
    meta = run_json(run_dir)
    assert meta["status"] == "completed"
    assert meta["schema_version"] == 2
    assert re.fullmatch(r"[0-9a-f]{32}", meta["run_id"]) and meta["run_id"] == running["run_id"]
    assert meta["started"] <= meta["ended"] <= time.time()
    assert meta["heartbeat"] >= meta["started"]
    assert meta["world_size"] == 1 and meta["pid"] > 0 and meta["host"]
    assert meta["flush_interval_s"] == FAST["flush_interval_s"]
    assert meta["versions"]["torch"] == torch.__version__ and meta["versions"]["python"]
    assert "tracealyze" in meta["versions"] and "cuda" in meta["versions"]
    n_params = sum(p.numel() for p in model.parameters())
    assert meta["model"]["class"] == "Sequential"
    assert meta["model"]["parameters"] == n_params == meta["model"]["trainable_parameters"]
    assert meta["model"]["tensors"] == 4
    assert meta["model"]["dtypes"] == ["float32"] and meta["model"]["devices"] == ["cpu"]
    assert meta["device"]["type"] == "cpu"
    assert meta["resumes"] == []
    assert meta["counters"]["recorder_errors"] == 0
    rank = json.loads((run_dir / "ranks" / "rank=0.json").read_text())
    assert rank["rank"] == 0 and rank["status"] == "completed" and rank["steps"] == 3
    assert rank["ended"] is not None and rank["pid"] == meta["pid"]


def test_parts_merged_at_close(run_dir: Path, model_opt: Any) -> None:
    model, opt = model_opt
    # flush_rows=1 flushes after every item, so each table gets several single parts.
    with Recorder(run_dir, model=model, optimizer=opt, flush_rows=1, **FAST) as rec:
        for i, (x, y) in enumerate(batches(5)):
            loss = loss_fn(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            rec.event("tick", f"step {i}", severity="info")
            # the writer flushes between steps: wait for this step's part (on a loaded
            # machine the writer thread may not run within a fixed sleep)
            deadline = time.monotonic() + 10
            while (len(list((run_dir / "steps" / "rank=0").glob("part-*"))) <= i
                   and time.monotonic() < deadline):
                time.sleep(0.02)
        single = sorted(p.name for p in (run_dir / "steps" / "rank=0").glob("part-*"))
        assert len(single) >= 2, single
    for table in ("steps", "tensor_stats", "memory", "events"):
        files = sorted(p.name for p in (run_dir / table / "rank=0").iterdir())
        assert len(files) == 1 and re.fullmatch(r"part-\d{6}-\d{6}\.parquet", files[0]), files
    assert sorted(steps_by_number(run_dir)) == list(range(5))
    assert [e["message"] for e in events(run_dir, "tick")] == [f"step {i}" for i in range(5)]


def test_merge_on_close_off_keeps_single_parts(run_dir: Path, model_opt: Any) -> None:
    model, opt = model_opt
    with Recorder(run_dir, model=model, optimizer=opt, flush_rows=1, merge_on_close=False,
                  **FAST) as rec:
        for x, y in batches(3):
            train(rec, model, opt, [(x, y)])
            time.sleep(0.12)  # past the flush interval: each step is flushed on its own
    files = sorted(p.name for p in (run_dir / "steps" / "rank=0").iterdir())
    assert len(files) >= 2 and all(re.fullmatch(r"part-\d{6}\.parquet", f) for f in files)
    assert sorted(steps_by_number(run_dir)) == [0, 1, 2]


# ------------------------------------------------------------------------- step pairing
def _loop_with_reference(run_dir: Path, order: str, n: int = 6) -> tuple[list, list]:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_norms, losses = [], []
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        for x, y in batches(n):
            loss = loss_fn(model, x, y)
            opt.zero_grad()
            loss.backward()
            ref_norms.append(grad_total_norm(model))
            losses.append(float(loss.detach()))
            if order == "before":
                rec.step(loss=loss)
                opt.step()
            else:
                opt.step()
                rec.step(loss=loss)
    return ref_norms, losses


def test_step_order_does_not_matter(tmp_path: Path) -> None:
    recorded = {}
    for order in ("before", "after"):
        ref_norms, losses = _loop_with_reference(tmp_path / order, order)
        steps = steps_by_number(tmp_path / order)
        assert sorted(steps) == list(range(len(losses)))
        for i in range(len(losses)):
            # Each step's loss is paired with the gradient that loss produced.
            assert steps[i]["loss"] == pytest.approx(losses[i], rel=1e-6)
            assert steps[i]["grad_norm"] == pytest.approx(ref_norms[i], rel=1e-5)
        recorded[order] = (
            [(s["step"], s["loss"], s["grad_norm"]) for s in steps.values()],
            sorted((r["step"], r["name"], r["norm"]) for r in stats_rows(tmp_path / order, "grad")),
        )
    assert recorded["before"] == recorded["after"]


@pytest.mark.parametrize("mode", ["once_after", "once_before", "per_micro_batch"])
def test_gradient_accumulation_one_step_per_optimizer_step(run_dir: Path, mode: str) -> None:
    k, n_opt = 3, 4
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = batches(k * n_opt)
    ref_norms, ref_losses = [], []
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        micro: list[float] = []
        for i, (x, y) in enumerate(data):
            loss = loss_fn(model, x, y) / k
            loss.backward()
            micro.append(float(loss.detach()))
            if mode == "per_micro_batch":
                rec.step(loss=loss)  # every micro-batch, before the optimizer steps
            if (i + 1) % k == 0:
                ref_norms.append(grad_total_norm(model))
                ref_losses.append(micro)
                micro = []
                if mode == "once_before":
                    rec.step(loss=loss)
                opt.step()
                opt.zero_grad()
                if mode == "once_after":
                    rec.step(loss=loss)
    steps = steps_by_number(run_dir)
    assert sorted(steps) == list(range(n_opt))
    for s in range(n_opt):
        assert steps[s]["grad_norm"] == pytest.approx(ref_norms[s], rel=1e-5)
        # per micro-batch the step's loss is the mean of its micro-batch losses
        exp = np.mean(ref_losses[s]) if mode == "per_micro_batch" else ref_losses[s][-1]
        assert steps[s]["loss"] == pytest.approx(exp, rel=1e-6)
    assert sorted({r["step"] for r in stats_rows(run_dir, "grad")}) == list(range(n_opt))


def test_accumulation_per_micro_batch_with_step_after_optimizer(run_dir: Path) -> None:
    # The common loop shape `backward(); if boundary: opt.step(); rec.step(loss)`: the
    # boundary micro-batch's loss belongs to the optimizer step that just ran.
    k, n_opt = 3, 4
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_losses: list[list[float]] = [[]]
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        for i, (x, y) in enumerate(batches(k * n_opt)):
            loss = loss_fn(model, x, y) / k
            loss.backward()
            ref_losses[-1].append(float(loss.detach()))
            if (i + 1) % k == 0:
                opt.step()
                opt.zero_grad()
                ref_losses.append([])
            rec.step(loss=loss)
    steps = steps_by_number(run_dir)
    assert sorted(steps) == list(range(n_opt))
    assert [steps[s]["loss"] for s in range(n_opt)] == pytest.approx(
        [np.mean(v) for v in ref_losses[:n_opt]], rel=1e-6)


def test_without_optimizer_grads_read_at_step(run_dir: Path) -> None:
    model = tiny_model()
    refs = []
    with Recorder(run_dir, model=model, **FAST) as rec:
        for x, y in batches(3):
            model.zero_grad()
            loss_fn(model, x, y).backward()
            refs.append(grad_total_norm(model))
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.05 * p.grad
            rec.step()
    steps = steps_by_number(run_dir)
    assert [steps[i]["grad_norm"] for i in range(3)] == pytest.approx(refs, rel=1e-5)
    assert all(s["lr"] is None and s["loss"] is None for s in steps.values())


def test_explicit_step_numbers_and_lr(run_dir: Path, model_opt: Any) -> None:
    model, opt = model_opt
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    lrs = []
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        for i, (x, y) in enumerate(batches(4)):
            loss = loss_fn(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            lrs.append(opt.param_groups[0]["lr"])
            if i == 0:
                rec.step(loss=loss, step=100)
            elif i == 3:
                rec.step(loss=loss, lr=torch.tensor(0.125))  # given lr wins
                lrs[-1] = 0.125
            else:
                rec.step(loss=loss)
            sched.step()
        assert rec.current_step == 104
    steps = steps_by_number(run_dir)
    assert sorted(steps) == [100, 101, 102, 103]
    assert [steps[s]["lr"] for s in sorted(steps)] == pytest.approx(lrs)
    assert lrs[:3] == [0.05, 0.025, 0.0125]


def test_varying_set_of_gradients_keeps_names_right(run_dir: Path) -> None:
    # Mixture-of-experts style: a different expert gets a gradient each step (zero_grad sets
    # the others to None), while the number of gradients stays the same.
    class Experts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shared = nn.Linear(4, 4)
            self.experts = nn.ModuleList(nn.Linear(4, 1) for _ in range(3))

        def forward(self, x: torch.Tensor, e: int) -> torch.Tensor:
            return self.experts[e](self.shared(x))

    torch.manual_seed(0)
    model = Experts()
    with torch.no_grad():  # very different scales per expert so names can be told apart
        for i, ex in enumerate(model.experts):
            ex.weight.mul_(10.0 ** i)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    expected: dict[tuple[int, str], float] = {}
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        for step, e in enumerate([0, 1, 2, 1, 0]):
            opt.zero_grad(set_to_none=True)
            model(torch.ones(2, 4), e).sum().backward()
            for name, p in model.named_parameters():
                if p.grad is not None:
                    expected[(step, name)] = float(p.grad.norm())
            opt.step()
            rec.step()
    got = {(r["step"], r["name"]): r["norm"] for r in stats_rows(run_dir, "grad")}
    assert set(got) == set(expected)
    for key, v in expected.items():
        assert got[key] == pytest.approx(v, rel=1e-5), key


# ------------------------------------------------------------------------- values
def test_metrics_floats_and_tensors(run_dir: Path, model_opt: Any) -> None:
    model, opt = model_opt
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        for i, (x, y) in enumerate(batches(2)):
            train(rec, model, opt, [(x, y)], py_float=0.25 * i, py_int=3,
                  t0d=torch.tensor(1.5 + i), t1=torch.tensor([2.0]),
                  t_int=torch.tensor(7), t_bool=torch.tensor(True),
                  t_half=torch.tensor(0.5, dtype=torch.float16))
    got = {(r["step"], r["name"]): r["value"] for r in rows(run_dir, "metrics")}
    for i in range(2):
        assert got[(i, "py_float")] == 0.25 * i and got[(i, "py_int")] == 3.0
        assert got[(i, "t0d")] == 1.5 + i and got[(i, "t1")] == 2.0
        assert got[(i, "t_int")] == 7.0 and got[(i, "t_bool")] == 1.0
        assert got[(i, "t_half")] == 0.5
    assert len(got) == 14


def test_watch_records_statistics(run_dir: Path, model_opt: Any) -> None:
    model, opt = model_opt
    latent = torch.tensor([[1.0, -3.0], [0.0, 2.0]])
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        rec.watch("latent", latent)
        rec.watch("ids", torch.tensor([1, 2, 3, 0]))
        rec.watch("nothing", torch.zeros(0))
        train(rec, model, opt, batches(1))
        rec.watch("latent", latent * 2)
        train(rec, model, opt, batches(1))
    w = {(r["step"], r["name"]): r for r in stats_rows(run_dir, "watch")}
    assert set(w) == {(0, "latent"), (0, "ids"), (0, "nothing"), (1, "latent")}
    r = w[(0, "latent")]
    a = latent.double().numpy()
    assert r["numel"] == 4
    assert r["norm"] == pytest.approx(np.linalg.norm(a))
    assert (r["absmax"], r["min"], r["max"]) == (3.0, -3.0, 2.0)
    assert r["mean"] == pytest.approx(a.mean()) and r["std"] == pytest.approx(a.std())
    assert r["zero_frac"] == 0.25 and r["nonfinite"] == 0
    assert w[(1, "latent")]["absmax"] == 6.0
    assert w[(0, "ids")]["mean"] == 1.5 and w[(0, "ids")]["zero_frac"] == 0.25
    e = w[(0, "nothing")]
    assert e["numel"] == 0 and e["norm"] == 0 and e["mean"] is None and e["max"] is None


def test_user_events(run_dir: Path, model_opt: Any) -> None:
    model, opt = model_opt
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        rec.event("setup", "before any step", severity="info")
        train(rec, model, opt, batches(2))
        rec.event("checkpoint", "saved", severity="critical", subject="ckpt.pt", size=12,
                  obj=object())
        rec.event("odd", "bad severity", severity="loud")
    ev = {e["kind"]: e for e in events(run_dir)}
    assert ev["setup"]["step"] == 0 and ev["setup"]["severity"] == "info"
    c = ev["checkpoint"]
    assert c["step"] == 2 and c["severity"] == "critical" and c["subject"] == "ckpt.pt"
    details = json.loads(c["details"])
    assert details["size"] == 12 and "object" in details["obj"]
    assert c["time"] == pytest.approx(time.time(), abs=60)
    assert ev["odd"]["severity"] in ("info", "warning", "error", "critical")


def test_wrap_loader_measures_data_wait(run_dir: Path, model_opt: Any) -> None:
    model, opt = model_opt
    data = batches(4)

    class SlowLoader:
        def __len__(self) -> int:
            return len(data)

        def __iter__(self) -> Iterator[Any]:
            for b in data:
                time.sleep(0.05)
                yield b

    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        loader = rec.wrap_loader(SlowLoader())
        assert len(loader) == 4  # type: ignore[arg-type]
        train(rec, model, opt, loader)
        train(rec, model, opt, data[:1])  # not through the wrapper
    steps = steps_by_number(run_dir)
    for i in range(4):
        # Each step waited at least the loader's sleep (lower bound only: no timing cap).
        assert steps[i]["data_wait_s"] >= 0.045, steps[i]
        assert steps[i]["duration_s"] >= steps[i]["data_wait_s"]
    assert steps[4]["data_wait_s"] is None
    # the first batch's leading dimension, for compare's comparability check
    assert run_json(run_dir)["data"] == {"batch_size": 5}


def test_batch_size_of_finds_the_leading_dimension() -> None:
    from tracealyze.recorder.training.loader import batch_size_of

    x = torch.zeros(7, 3)
    assert batch_size_of(x) == 7
    assert batch_size_of((x, torch.zeros(7))) == 7
    assert batch_size_of({"labels": [1, 2], "input_ids": torch.zeros(3, 128)}) == 3
    assert batch_size_of([["text"], (torch.zeros(2, 2),)]) == 2
    assert batch_size_of(torch.tensor(1.0)) is None and batch_size_of("abc") is None


def test_odd_values_never_break_training(run_dir: Path) -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.frozen = nn.Linear(4, 8)
            self.head = nn.Linear(8, 2)
            self.unused = nn.Linear(3, 3)  # never called: its grads stay None
            self.frozen.requires_grad_(False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.relu(self.frozen(x)))

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    odd_losses: list[Any] = [None, 1.5, 3, torch.tensor(2, dtype=torch.int64),
                             torch.tensor([1.0, 3.0]), torch.tensor(float("nan")), None]
    with Recorder(run_dir, model=model, optimizer=opt, preset="debug", tensor_stats_every=1,
                  param_stats_every=1, update_ratio_every=1, activation_stats_every=1,
                  **FAST) as rec:
        for (x, y), odd in zip(batches(len(odd_losses)), odd_losses, strict=True):
            loss = loss_fn(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=odd, half=torch.tensor(1.0, dtype=torch.bfloat16))
        assert rec.errors == 0
    steps = steps_by_number(run_dir)
    assert [steps[i]["loss"] for i in (0, 1, 2, 3, 4)] == [None, 1.5, 3.0, 2.0, 2.0]
    assert events(run_dir, "recorder_error") == []
    grad_names = {r["name"] for r in stats_rows(run_dir, "grad")}
    assert grad_names == {"head.weight", "head.bias"}  # frozen and unused have no grads
    param_names = {r["name"] for r in stats_rows(run_dir, "param")}
    assert param_names == {n for n, _ in model.named_parameters()}
    assert {r["name"] for r in stats_rows(run_dir, "update")} == {"head.weight", "head.bias",
                                                                   "unused.weight", "unused.bias"}
    nonfinite = events(run_dir, "nonfinite")
    assert [(e["step"], e["subject"]) for e in nonfinite] == [(5, "loss")]


def test_nan_loss_is_recorded_as_nan_not_null(run_dir: Path, model_opt: Any) -> None:
    # FORMAT.md: null means "not given"; a NaN loss is data the analyzer must see.
    model, opt = model_opt
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        train(rec, model, opt, batches(1))
        rec.step(loss=float("nan"))
        rec.step(loss=torch.tensor(float("inf")))
        rec.step(loss=None)
    steps = steps_by_number(run_dir)
    assert steps[1]["loss"] is not None and math.isnan(steps[1]["loss"])
    assert steps[2]["loss"] == math.inf
    assert steps[3]["loss"] is None


def test_empty_tensor_loss_is_null_not_a_nonfinite_error(run_dir: Path, model_opt: Any) -> None:
    model, opt = model_opt
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        train(rec, model, opt, batches(1))
        rec.step(loss=torch.zeros(0), empty=torch.zeros(0))
    steps = steps_by_number(run_dir)
    assert steps[1]["loss"] is None
    assert events(run_dir, "nonfinite") == []


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_low_and_double_precision_models(run_dir: Path, dtype: torch.dtype) -> None:
    model = tiny_model(dtype=dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(run_dir, model=model, optimizer=opt, preset="debug", tensor_stats_every=2,
                  activation_stats_every=2, update_ratio_every=2, **FAST) as rec:
        refs = []
        for x, y in batches(4, dtype=dtype):
            loss = loss_fn(model, x, y)
            opt.zero_grad()
            loss.backward()
            refs.append(grad_total_norm(model))
            opt.step()
            rec.step(loss=loss)
        assert rec.errors == 0
    steps = steps_by_number(run_dir)
    assert [steps[i]["grad_norm"] for i in range(4)] == pytest.approx(refs, rel=1e-3)
    assert events(run_dir, "recorder_error") == []
    assert {r["kind"] for r in rows(run_dir, "tensor_stats")} == {
        "grad", "param", "update", "activation"}
    assert run_json(run_dir)["model"]["dtypes"] == [str(dtype).replace("torch.", "")]


def test_compiled_model_names_unwrapped(run_dir: Path) -> None:
    model = tiny_model()
    compiled = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with Recorder(run_dir, model=compiled, optimizer=opt, preset="debug", **FAST) as rec:
        for x, y in batches(3):
            loss = loss_fn(compiled, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
        assert rec.errors == 0
    names = {r["name"] for r in stats_rows(run_dir, "grad")}
    assert names == set(PARAM_NAMES)
    assert sorted(steps_by_number(run_dir)) == [0, 1, 2]
    assert run_json(run_dir)["model"]["class"] == "Sequential"


# ------------------------------------------------------------------------- NaN tracing
class _NaNAt(nn.Module):
    """Identity, except that it puts a NaN into its output at one step."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.at = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls - 1 == self.at:
            x = x.clone()
            x[0, 0] = float("nan")
        return x


class _Traced(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
        self.block = nn.Sequential(nn.Linear(8, 8), _NaNAt(), nn.ReLU())
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.enc(x)))


def test_activation_nan_traced_to_module(run_dir: Path) -> None:
    torch.manual_seed(0)
    model = _Traced()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with Recorder(run_dir, model=model, optimizer=opt, preset="debug", **FAST) as rec:
        train(rec, model, opt, batches(5))
    nf = events(run_dir, "nonfinite")
    act = [e for e in nf if json.loads(e["details"]).get("source") == "activation"]
    assert [(e["step"], e["subject"]) for e in act] == [(2, "block.1")]
    bad = [r for r in stats_rows(run_dir, "activation") if r["nonfinite"]]
    # (0 * NaN is NaN: the weights go NaN after step 2 even with lr 0, so later steps are
    # bad everywhere; only the first occurrence is an event.)
    assert bad and min(r["step"] for r in bad) == 2
    at2 = [r for r in bad if r["step"] == 2]
    assert min(at2, key=lambda r: r["seq"])["name"] == "block.1"
    assert {"enc.0", "enc.1", "block.0"}.isdisjoint(r["name"] for r in at2)


class _ParentNaN(nn.Module):
    """Arithmetic in its own forward (a division by zero at its second call) whose Inf/NaN
    goes through a ReLU child before the module returns."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        h = self.lin(x)
        return self.act(h / 0.0 if self.calls == 2 else h)


def test_finite_preserving_modules_are_probed_only_at_statistics_steps(run_dir: Path) -> None:
    # A ReLU cannot turn finite values into NaN/Inf: the every-step probe skips it (a hook
    # on every module slows every forward), and a NaN made by arithmetic in the parent's
    # forward is blamed on the parent, whose output is probed after its children.
    torch.manual_seed(0)
    model = nn.Sequential(_ParentNaN(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with Recorder(run_dir, model=model, optimizer=opt, activation_nonfinite=True,
                  activation_stats_every=2, **FAST) as rec:
        train(rec, model, opt, batches(4))
    act = [e for e in events(run_dir, "nonfinite")
           if json.loads(e["details"]).get("source") == "activation"]
    assert [(e["step"], e["subject"]) for e in act] == [(1, "0")]
    rows_ = stats_rows(run_dir, "activation")
    probed_at_1 = {r["name"] for r in rows_ if r["step"] == 1}
    assert "0" in probed_at_1 and "0.lin" in probed_at_1 and "0.act" not in probed_at_1
    # Statistics steps (0, 2) cover every module, the ReLU included (dead activations).
    stats_at = {s: {r["name"] for r in rows_ if r["step"] == s and r["mean"] is not None}
                for s in (0, 2)}
    assert all("0.act" in names and "0.lin" in names for names in stats_at.values())


class _MaskedProjection(nn.Module):
    """Attention-style: -inf written in place into a projection's output after it returned
    (healthy: the softmax turns it into zeros)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.proj(x)
        s.masked_fill_(torch.arange(8) >= 6, float("-inf"))
        return self.head(torch.softmax(s, dim=-1))


def test_output_masked_in_place_later_is_no_nan_alarm(run_dir: Path) -> None:
    # Probed at the end of the forward pass, proj's output holds the -inf written after proj
    # returned: flagged as changed in place, it cannot by itself raise an alarm.
    torch.manual_seed(0)
    model = _MaskedProjection()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(run_dir, model=model, optimizer=opt, activation_nonfinite=True,
                  **FAST) as rec:
        train(rec, model, opt, batches(4))
        assert rec.errors == 0
    assert events(run_dir, "nonfinite") == []
    assert [r for r in stats_rows(run_dir, "activation") if r["nonfinite"]] == []


def test_nan_under_an_inplace_relu_is_blamed_on_the_module_that_made_it(run_dir: Path) -> None:
    # _NaNAt's output is modified in place by ReLU(inplace=True) (NaN stays NaN): the
    # module that made the NaN is still the one blamed, not the next Linear.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), _NaNAt(), nn.ReLU(inplace=True), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with Recorder(run_dir, model=model, optimizer=opt, activation_nonfinite=True,
                  **FAST) as rec:
        train(rec, model, opt, batches(4))
    act = [e for e in events(run_dir, "nonfinite")
           if json.loads(e["details"]).get("source") == "activation"]
    assert [(e["step"], e["subject"]) for e in act] == [(2, "1")]


def test_gradient_nan_traced_to_first_parameter(run_dir: Path, model_opt: Any) -> None:
    model, opt = model_opt
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        for i, (x, y) in enumerate(batches(4)):
            loss = loss_fn(model, x, y)
            opt.zero_grad()
            loss.backward()
            if i == 1:
                model[2].bias.grad[0] = float("nan")
                model[2].weight.grad[0, 0] = float("inf")
            opt.step()
            rec.step(loss=loss)
    steps = steps_by_number(run_dir)
    assert steps[0]["nonfinite_grads"] == 0
    assert steps[1]["nonfinite_grads"] == 2
    assert steps[1]["grad_norm"] is not None and not math.isfinite(steps[1]["grad_norm"])
    grad1 = {r["name"]: r["norm"] for r in stats_rows(run_dir, "grad") if r["step"] == 1}
    assert grad1["2.weight"] is not None and math.isinf(grad1["2.weight"])
    assert grad1["2.bias"] is not None and math.isnan(grad1["2.bias"])
    assert math.isfinite(grad1["0.weight"])
    g = [e for e in events(run_dir, "nonfinite") if json.loads(e["details"])["source"] ==
         "gradient"]
    assert [(e["step"], e["subject"]) for e in g] == [(1, "2.weight")]


# ------------------------------------------------------------------------- AMP
@pytest.mark.parametrize("step_after_update", [False, True])
def test_grad_scaler_scale_and_skipped_steps(run_dir: Path, model_opt: Any,
                                             step_after_update: bool) -> None:
    try:
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    except Exception as exc:  # pragma: no cover - old torch
        pytest.skip(f"GradScaler on CPU unsupported: {exc}")
    model, opt = model_opt
    scales_used = []
    with Recorder(run_dir, model=model, optimizer=opt, scaler=scaler, **FAST) as rec:
        for i, (x, y) in enumerate(batches(5)):
            loss = loss_fn(model, x, y)
            opt.zero_grad()
            scales_used.append(scaler.get_scale())
            scaled = scaler.scale(loss)
            if i == 2:
                scaled = scaled * math.inf  # overflow: the scaler must skip this step
            scaled.backward()
            scaler.step(opt)
            if step_after_update:  # the scale recorded is still the one this step used
                scaler.update()
                rec.step(loss=loss)
            else:
                rec.step(loss=loss)
                scaler.update()
    steps = steps_by_number(run_dir)
    assert sorted(steps) == list(range(5))
    assert [steps[i]["amp_skipped"] for i in range(5)] == [False, False, True, False, False]
    assert [steps[i]["loss_scale"] for i in range(5)] == scales_used
    assert scales_used[3] == scales_used[2] / 2  # the scaler did back off
    assert steps[2]["nonfinite_grads"] > 0
    assert steps[3]["nonfinite_grads"] == 0 and math.isfinite(steps[3]["grad_norm"])


# ------------------------------------------------------------------------- profiler
def test_profiler_window_writes_trace(run_dir: Path, model_opt: Any) -> None:
    model, opt = model_opt
    with Recorder(run_dir, model=model, optimizer=opt, preset="standard", profile_start=2,
                  profile_warmup=1, profile_active=2, system_interval_s=0,
                  flush_interval_s=0.05) as rec:
        train(rec, model, opt, batches(6))
    traces = sorted((run_dir / "traces" / "rank=0").glob("*.pt.trace.json.gz"))
    assert len(traces) == 1, list((run_dir / "traces").rglob("*"))
    with gzip.open(traces[0], "rt") as fh:
        trace = json.load(fh)
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"ProfilerStep#2", "ProfilerStep#3"} <= names
    assert not list((run_dir / "traces").rglob("*.tmp"))


# ------------------------------------------------------------------------- config errors
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"preset": "turbo"}, "unknown preset"),
    ({"grad_norm_evry": 1}, "unknown recorder option"),
    ({"tensor_stats_every": -1}, "tensor_stats_every"),
    ({"flush_interval_s": -1.0}, "flush_interval_s"),
    ({"flush_interval_s": 0}, "flush_interval_s"),
    ({"memory_every": 1.5}, "memory_every"),
    ({"store_grad_norms": "yes"}, "store_grad_norms"),
    ({"queue_size": 0}, "queue_size"),
    ({"resume": "yes"}, "resume"),
    ({"model": "not a model"}, "model"),
    ({"optimizer": object()}, "optimizer"),
])
def test_bad_configuration_raises_value_error(run_dir: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Recorder(run_dir, **kwargs)
    assert not (run_dir / "run.json").exists()


def test_run_dir_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        Recorder(f)
    with pytest.raises(ValueError, match="cannot write"):
        Recorder(f / "sub")  # a parent is a file: unwritable


def test_existing_run_refused_without_resume(run_dir: Path, model_opt: Any) -> None:
    model, opt = model_opt
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        train(rec, model, opt, batches(1))
    before = (run_dir / "run.json").read_text()
    with pytest.raises(ValueError, match="resume=True"):
        Recorder(run_dir, model=model, optimizer=opt, **FAST)
    assert (run_dir / "run.json").read_text() == before


def test_close_is_idempotent_and_later_calls_are_noops(run_dir: Path, model_opt: Any) -> None:
    model, opt = model_opt
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        train(rec, model, opt, batches(2))
        rec.close()
        meta = run_json(run_dir)
        rec.close()
        rec.step(loss=1.0)
        rec.event("late", "after close")
        rec.watch("late", torch.ones(2))
        train(rec, model, opt, batches(1))  # hooks are gone: nothing more recorded
    assert run_json(run_dir) == meta
    assert sorted(steps_by_number(run_dir)) == [0, 1]
    assert events(run_dir, "late") == []


def test_disabled_recorder_writes_nothing(run_dir: Path, model_opt: Any) -> None:
    model, opt = model_opt
    with Recorder(run_dir, model=model, optimizer=opt, enabled=False) as rec:
        train(rec, model, opt, batches(2))
        rec.event("x", "y")
        rec.watch("w", torch.ones(1))
    assert not run_dir.exists()


def test_eval_forwards_without_grad_are_not_recorded_as_training(run_dir: Path,
                                                                  model_opt: Any) -> None:
    # An evaluation loop between steps (no_grad) with a NaN batch: not a training NaN, and
    # the open step must not pile up per-module pieces.
    model, opt = model_opt
    with Recorder(run_dir, model=model, optimizer=opt, activation_nonfinite=True,
                  **FAST) as rec:
        train(rec, model, opt, batches(2))
        with torch.no_grad():
            for x, _ in batches(50):
                model(x * math.nan)
        assert rec._life.acc.act_seq == 0
        train(rec, model, opt, batches(2))
    assert events(run_dir, "nonfinite") == []
    assert sorted(steps_by_number(run_dir)) == list(range(4))


def test_planned_grad_norms_keep_names_and_parameter_order(run_dir: Path) -> None:
    # Small same-shape gradients are stacked on the CPU, so the plan's values come large
    # first: each norm must still be stored under its own parameter's name, and the event
    # must name the first parameter in *parameter* order whose gradient went nonfinite.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 5000), nn.Linear(5000, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    names = [n for n, _ in model.named_parameters()]
    x = torch.randn(3, 4)
    expected: dict[int, dict[str, float]] = {}
    with Recorder(run_dir, model=model, optimizer=opt, tensor_stats_every=0, **FAST) as rec:
        for step in range(2):
            opt.zero_grad()
            model(x).square().mean().backward()
            if step == 1:  # a large weight late in the model and an early small bias go bad
                model[2].weight.grad[0, 0] = math.nan
                model[0].bias.grad[0] = math.inf
            expected[step] = {n: float(p.grad.norm()) for n, p in model.named_parameters()}
            opt.step()
            rec.step(loss=1.0)
        plan = rec._reader.layout.plan
        # The case this test is about: values out of parameter order.
        assert plan is not None and plan.order is not None
        assert list(plan.order) != list(range(len(names)))
    got = {(r["step"], r["name"]): r["norm"] for r in stats_rows(run_dir, "grad")}
    assert set(got) == {(s, n) for s in (0, 1) for n in names}
    for (s, n), v in got.items():
        ref = expected[s][n]
        assert (math.isclose(v, ref, rel_tol=1e-5) if math.isfinite(ref)
                else not math.isfinite(v)), (s, n, v, ref)
    assert [(e["step"], e["subject"]) for e in events(run_dir, "nonfinite")] == [(1, "0.bias")]


def test_sparse_and_missing_gradients_are_left_out_of_gradient_rows(run_dir: Path) -> None:
    # A sparse embedding gradient is skipped (norms are for dense gradients), a frozen
    # layer has none; the set of parameters with gradients changes mid-run (a layer is
    # unfrozen) and is planned again.
    torch.manual_seed(0)
    emb, head, frozen = nn.Embedding(10, 4, sparse=True), nn.Linear(4, 2), nn.Linear(4, 2)
    frozen.requires_grad_(False)
    model = nn.ModuleDict({"emb": emb, "head": head, "frozen": frozen})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    idx = torch.tensor([1, 2, 3])
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        for step in range(4):
            if step == 2:
                frozen.requires_grad_(True)
            opt.zero_grad()
            h = emb(idx)
            (head(h).square().mean() + frozen(h).square().mean()).backward()
            opt.step()
            rec.step(loss=1.0)
        assert rec.errors == 0
    grad_rows = stats_rows(run_dir, "grad")
    by_step: dict[int, set[str]] = {}
    for r in grad_rows:
        by_step.setdefault(r["step"], set()).add(r["name"])
    assert by_step == {0: {"head.weight", "head.bias"}, 1: {"head.weight", "head.bias"},
                       2: {"head.weight", "head.bias", "frozen.weight", "frozen.bias"},
                       3: {"head.weight", "head.bias", "frozen.weight", "frozen.bias"}}
    steps = steps_by_number(run_dir)
    assert all(steps[s]["nonfinite_grads"] == 0 and steps[s]["grad_norm"] > 0
               for s in range(4))


def test_each_rank_file_names_the_host_it_ran_on(tmp_path: Path) -> None:
    """A run resumed on another node: run.json keeps the host that started it, the rank
    file names this one (fleet analysis blames slow ranks on their hosts)."""
    import socket

    run_dir = tmp_path / "run"
    model = nn.Linear(4, 1)
    with Recorder(run_dir, model=model, **FAST) as rec:
        rec.step(loss=model(torch.randn(2, 4)).sum())
    meta = run_json(run_dir)
    meta["host"] = "node-that-was-preempted"
    (run_dir / "run.json").write_text(json.dumps(meta))
    with Recorder(run_dir, model=model, resume=True, **FAST) as rec:
        rec.step(loss=model(torch.randn(2, 4)).sum())
    rank = json.loads((run_dir / "ranks" / "rank=0.json").read_text())
    assert rank["host"] == socket.gethostname()
    assert run_json(run_dir)["host"] == "node-that-was-preempted"
