"""Values a training script passes that are not what the API asks for: one bad value is
dropped (counted, warned once), never the step, its number, or the other rows of a flush."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
