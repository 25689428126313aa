"""Gradient norms before clipping: the recorder takes the per-parameter norms that
clip_grad_norm_ computes (no second read), records max_norm, and leaves what torch computes
bitwise unchanged."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.utils.clip_grad as clip_grad
from rec_helpers import FAST, batches, steps_by_number, tiny_model
from torch import nn
from tracealyze.recorder import Recorder


def _loop(model: nn.Module, opt: torch.optim.Optimizer, data, rec=None, max_norm=0.05,
          params=None) -> tuple[list[torch.Tensor], list[float]]:
    totals, pre = [], []
    for x, y in data:
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        pre.append(float(torch.linalg.vector_norm(
            torch.stack([p.grad.norm() for p in model.parameters()]))))
        totals.append(nn.utils.clip_grad_norm_(params or model.parameters(), max_norm))
        opt.step()
        if rec is not None:
            rec.step(loss=loss)
    return totals, pre


def test_norms_are_taken_before_clipping_and_training_is_bitwise_unchanged(
        tmp_path: Path) -> None:
    data = batches(12)
    ref = tiny_model()
    ref_totals, pre = _loop(ref, torch.optim.SGD(ref.parameters(), lr=0.1), data)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(tmp_path / "run", model=model, optimizer=opt, **FAST) as rec:
        totals, _ = _loop(model, opt, data, rec)
    # the same totals and the same weights, bit for bit
    assert all(torch.equal(a, b) for a, b in zip(totals, ref_totals, strict=True))
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)
    steps = steps_by_number(tmp_path / "run")
    assert len(steps) == 12
    for i, s in steps.items():
        # the norm before clipping (every step here is clipped: 0.05 is below them all) ...
        assert s["grad_norm"] > 0.05
        assert abs(s["grad_norm"] - pre[i]) <= 1e-5 * pre[i]
        # ... and the threshold
        assert s["grad_clip_max"] == 0.05
    # torch's functions are back once the recorder closed
    assert clip_grad._get_total_norm.__module__ == "torch.nn.utils.clip_grad"
    assert clip_grad._clip_grads_with_norm_.__module__ == "torch.nn.utils.clip_grad"


def test_clipping_other_tensors_is_left_to_torch(tmp_path: Path) -> None:
    """clip_grad_norm_ over a subset of the parameters: those are not the model's gradients,
    so the recorder reads its own norms (after clipping) as without clipping."""
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = list(model.parameters())[:2]
    with Recorder(tmp_path / "run", model=model, optimizer=opt, **FAST) as rec:
        _loop(model, opt, batches(4), rec, params=first, max_norm=1e-3)
    for s in steps_by_number(tmp_path / "run").values():
        assert s["grad_norm"] is not None
        assert s["grad_clip_max"] == 1e-3  # the threshold is still the loop's


def test_unclipped_run_has_no_clip_threshold(tmp_path: Path) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(tmp_path / "run", model=model, optimizer=opt, **FAST) as rec:
        for x, y in batches(3):
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    assert {s["grad_clip_max"] for s in steps_by_number(tmp_path / "run").values()} == {None}


def test_clipped_norms_keep_the_configured_cadence(tmp_path: Path) -> None:
    """Norms that clip_grad_norm_ computes anyway are still recorded at ``grad_norm_every``
    only: the knob, not the clipping, decides how many rows the run writes (a Trainer clips
    every step; before, every step's per-parameter norms were written whatever the knob)."""
    data = batches(12)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(tmp_path / "run", model=model, optimizer=opt,
                  **{**FAST, "grad_norm_every": 4}) as rec:
        _loop(model, opt, data, rec)
    steps = steps_by_number(tmp_path / "run")
    with_norm = sorted(i for i, s in steps.items() if s["grad_norm"] is not None)
    assert with_norm == [0, 4, 8]
    assert all(steps[i]["grad_clip_max"] == 0.05 for i in steps)


def test_clipping_through_torchs_public_two_step_api_is_seen(tmp_path: Path) -> None:
    """accelerate 1.x clips with ``torch.nn.utils.get_total_norm`` then
    ``clip_grads_with_norm_`` (looked up at call time, as HF Trainer's clipping does): the
    norms recorded are those before clipping, the threshold is noted, training is bitwise
    unchanged, and torch's public names are put back when the recorder closes."""
    originals = (nn.utils.get_total_norm, nn.utils.clip_grads_with_norm_)

    def loop(model, opt, rec=None):
        pre = []
        for x, y in batches(8):
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            from torch.nn.utils import clip_grads_with_norm_, get_total_norm
            grads = [p.grad for p in model.parameters()]
            total = get_total_norm(grads)
            pre.append(float(total))
            clip_grads_with_norm_(list(model.parameters()), 0.05, total)
            opt.step()
            if rec is not None:
                rec.step(loss=loss)
        return pre

    ref = tiny_model()
    pre = loop(ref, torch.optim.SGD(ref.parameters(), lr=0.1))
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(tmp_path / "run", model=model, optimizer=opt, **FAST) as rec:
        loop(model, opt, rec)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)
    for i, s in steps_by_number(tmp_path / "run").items():
        assert abs(s["grad_norm"] - pre[i]) <= 1e-5 * pre[i], (i, s["grad_norm"], pre[i])
        assert s["grad_clip_max"] == 0.05
    assert (nn.utils.get_total_norm, nn.utils.clip_grads_with_norm_) == originals
