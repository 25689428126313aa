"""zero_nonfinite_grads (on in debug): a step with a NaN/Inf gradient applies none of its
gradients, decided on the device; the weights stay finite, so anomaly mode catches the op
that makes the next NaN, not a bystander downstream of NaN weights."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from tracealyze.analyzer import build_summary
from tracealyze.recorder import Recorder
from tracealyze.recorder.tensors.update_guard import zero_if_nonfinite

from tests.recorder.test_anomaly_window import EVERY, Net, _batch, _events

LINE = next(i for i, text in enumerate(
    (Path(__file__).parent / "test_anomaly_window.py").read_text().splitlines(), 1)
    if text.rstrip().endswith("FORWARD_" + "LINE"))


def _grads(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(5, 3, generator=g), torch.randn(7, generator=g).to(torch.bfloat16),
            torch.randn(2, 2, 2, generator=g, dtype=torch.float64)]


@pytest.mark.parametrize("seed", range(3))
def test_finite_gradients_are_left_bit_for_bit(seed: int) -> None:
    grads = _grads(seed)
    before = [g.clone() for g in grads]
    zero_if_nonfinite(grads)
    assert all(torch.equal(a, b) for a, b in zip(grads, before, strict=True))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", [0, 1, 2])
def test_one_nonfinite_value_anywhere_zeroes_the_whole_step(bad: float, where: int) -> None:
    grads = _grads(where)
    grads[where].view(-1)[1] = bad
    zero_if_nonfinite([*grads, None])  # (a parameter without a gradient is skipped)
    assert all(bool((g == 0).all()) for g in grads)


def _train(run: Path, steps: int, **knobs) -> list[float]:
    """The anomaly window's network and bad batches, with a loop that guards nothing."""
    torch.manual_seed(0)
    m = Net()
    with torch.no_grad():
        m.a.bias.zero_()
    m.a.bias.requires_grad_(False)
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.01)
    losses = []
    with Recorder(run, model=m, optimizer=opt, preset="debug", flush_interval_s=0.2,
                  profile_start=0, system_interval_s=0, **knobs) as rec:
        for step in range(steps):
            loss = m(_batch(step)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            losses.append(float(loss))
            time.sleep(0.02)  # (steps long enough for the writer to see each NaN in time)
    return losses


def test_the_weights_stay_finite_and_the_origin_is_caught(tmp_path: Path) -> None:
    losses = _train(tmp_path / "run", 48)  # the debug preset: on
    bad = [s for s in range(48) if s % EVERY == EVERY - 1]
    # the bad batches' NaN gradients were never applied: every other step's loss is finite
    assert all(torch.isfinite(torch.tensor(v)) for s, v in enumerate(losses) if s not in bad)
    caught = _events(tmp_path / "run", "anomaly")
    assert caught and all(e["step"] in bad for e in caught)
    d = json.loads(caught[0]["details"])
    assert d["user_frame"].endswith(f"test_anomaly_window.py:{LINE}")  # the sqrt's line
    (f,) = [f for f in build_summary(tmp_path / "run")["findings"] if f["id"] == "nonfinite"]
    assert not f["evidence"]["anomaly"].get("downstream")
    assert "downstream" not in f["message"]


def test_without_it_the_op_caught_is_named_downstream(tmp_path: Path) -> None:
    losses = _train(tmp_path / "run", 30, zero_nonfinite_grads=False)
    first_bad = EVERY - 1
    # the first bad step's NaN gradient was applied: every loss after it is NaN
    assert all(not torch.isfinite(torch.tensor(v)) for v in losses[first_bad + 1:])
    (f,) = [f for f in build_summary(tmp_path / "run")["findings"] if f["id"] == "nonfinite"]
    a = f["evidence"]["anomaly"]
    assert a["step"] > first_bad and a["downstream"] is True
    assert f["first_step"] == first_bad
    assert "downstream" in f["message"] and "zero_nonfinite_grads" in f["message"]
