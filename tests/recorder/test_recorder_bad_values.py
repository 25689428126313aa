"""Values a training script passes that are not what the API asks for: one bad value is
dropped (counted, warned once), never the step, its number, or the other rows of a flush."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from rec_helpers import FAST, batches, events, loss_fn, rows, run_json, steps_by_number, tiny_model
from tracealyze.recorder import Recorder
from tracealyze.recorder.config import _check

BAD = ["abc", 1 + 2j, [1.0, 2.0], {"a": 1}, b"xy", -10**400,
       torch.empty(1, device="meta"), torch.tensor([1 + 1j])]


def test_bad_step_values_drop_the_value_not_the_step(run_dir: Path, capfd) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    n = 3 * len(BAD)
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        for i, (x, y) in enumerate(batches(n)):
            loss = loss_fn(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            bad = BAD[i % len(BAD)]
            if i % 3 == 0:
                rec.step(loss=bad, acc=0.5)           # a bad loss
            elif i % 3 == 1:
                rec.step(loss=loss, acc=bad)          # a bad metric
            else:
                rec.step(loss=loss, acc=0.5, name="string metric")  # a string metric
    got = steps_by_number(run_dir)
    assert sorted(got) == list(range(n))  # no step lost, none renumbered
    assert all(got[i]["loss"] is None for i in range(0, n, 3))
    assert all(got[i]["loss"] is not None for i in range(1, n, 3))
    metrics = [(r["step"], r["name"], r["value"]) for r in rows(run_dir, "metrics")]
    assert {s for s, name, _ in metrics if name == "acc"} == set(range(n)) - set(range(1, n, 3))
    assert "name" not in {name for _, name, _ in metrics}
    dropped = run_json(run_dir)["counters"]["dropped"]["step_values"]
    assert dropped == n  # one bad value per step
    (ev,) = events(run_dir, "dropped_data")
    assert ev["severity"] == "warning" and "not a real number" in ev["message"]
    assert capfd.readouterr().err.count("is not a number") == 1


def test_one_bad_event_loses_nothing_else(run_dir: Path) -> None:
    """subject=42 once made the whole flush's Arrow conversion fail: every event of that
    flush was dropped, the crash's exception event included."""
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    class Weird:
        def __str__(self) -> str:
            return "weird"

    with pytest.raises(RuntimeError, match="boom"), Recorder(
            run_dir, model=model, optimizer=opt, **{**FAST, "flush_interval_s": 60}) as rec:
        rec.event("ckpt", "saved", severity="info")
        rec.event("odd", 123, subject=42, severity="nonsense", n=Weird(), **{"k": {1, 2}})
        rec.event(7, "kind is a number", subject=Weird())
        raise RuntimeError("boom")
    by_kind = {e["kind"]: e for e in events(run_dir)}
    assert {"ckpt", "odd", "7", "exception"} <= set(by_kind)
    assert by_kind["odd"]["subject"] == "42" and by_kind["odd"]["message"] == "123"
    assert by_kind["odd"]["severity"] == "warning"
    assert json.loads(by_kind["odd"]["details"])["n"] == "weird"
    assert by_kind["7"]["subject"] == "weird"
    assert "RuntimeError: boom" in by_kind["exception"]["message"]


def test_disabled_recorder_has_a_current_step(run_dir: Path) -> None:
    rec = Recorder(run_dir, enabled=False)
    assert rec.current_step == 0
    rec.step(loss=1.0)
    rec.close()
    assert not run_dir.exists()


@pytest.mark.parametrize("hint, value, ok", [
    (int | None, None, True), (int | None, 3, True), (int | None, "3", False),
    (int | None, -1, False), (float | None, float("nan"), False), (bool, 1, False),
    (float, 2, True), (int, 2.0, False),
])
def test_config_checks_optional_fields(hint: Any, value: Any, ok: bool) -> None:
    if ok:
        _check("knob", value, hint)
    else:
        with pytest.raises(ValueError, match="knob"):
            _check("knob", value, hint)


def _odd_tensors() -> dict[str, Any]:
    dense = torch.randn(3, 4)
    return {
        "meta": torch.empty(3, device="meta"),
        "sparse_coo": dense.to_sparse(),
        "sparse_csr": dense.to_sparse_csr(),
        "nested": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
        "quantized": torch.quantize_per_tensor(dense, 0.1, 0, torch.qint8),
    }


@pytest.mark.filterwarnings("ignore::UserWarning")  # beta/prototype/deprecated layouts
def test_a_bad_watch_is_left_out_alone(run_dir: Path) -> None:
    """rec.watch(name, <meta tensor>) made the next step fail ("Cannot copy out of meta
    tensor"): its loss, gradient norm and metrics were lost (10 of 20 rows kept)."""
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    odd = _odd_tensors()
    n = 4 * len(odd)
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        for i, (x, y) in enumerate(batches(n)):
            loss = loss_fn(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            kind = list(odd)[i % len(odd)]
            rec.watch(f"odd_{kind}", odd[kind])
            rec.watch("good", torch.full((3,), float(i)))
            rec.watch("complex", torch.tensor([3 + 4j, 0j]))  # its magnitude
            rec.step(loss=loss, acc=0.5)
    got = steps_by_number(run_dir)
    assert sorted(got) == list(range(n))
    assert all(got[i]["loss"] is not None and got[i]["grad_norm"] is not None
               for i in range(n))
    watched = {(r["step"], r["name"]): r for r in rows(run_dir, "tensor_stats")
               if r["kind"] == "watch"}
    assert {name for _, name in watched} == {"good", "complex"}
    assert all(watched[(i, "good")]["max"] == float(i) for i in range(n))
    assert watched[(0, "complex")]["max"] == 5.0
    assert len([r for r in rows(run_dir, "metrics") if r["name"] == "acc"]) == n
    assert run_json(run_dir)["counters"]["recorder_errors"] == n
    messages = " ".join(e["message"] for e in events(run_dir, "recorder_error"))
    for kind in odd:
        assert f"odd_{kind}" in messages, kind


def test_a_meta_piece_past_validation_costs_only_its_values() -> None:
    """Defence in depth: a piece that cannot be read becomes NaN; the step's other values
    are kept (capture.pack, rows._vector)."""
    from tracealyze.recorder.capture import StepAccum, pack
    from tracealyze.recorder.write.rows import _vector

    acc = StepAccum(step=0)
    acc.tensors = [torch.tensor([1.0, 2.0]), torch.empty(2, device="meta"), torch.tensor([3.0])]
    host, event = pack(acc)
    assert event is None
    v = _vector(host)
    assert v[:2].tolist() == [1.0, 2.0] and v[-1] == 3.0 and np.isnan(v[2:4]).all()
