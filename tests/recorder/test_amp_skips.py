"""A GradScaler skips steps on purpose: it starts at a scale that overflows and halves until
it fits, and after each growth it tries a doubled scale that may overflow once. Those skips
are the scaler working, never a warning, however many there are; skips beyond them (the
gradients themselves overflow again and again) are. Real GradScaler runs (CPU; the CUDA
case is in test_gpu_training)."""

from __future__ import annotations

from pathlib import Path

import torch
from rec_helpers import FAST
from torch import nn
from tracealyze.analyzer import build_summary
from tracealyze.recorder import Recorder


def _train(run: Path, *, init_scale: float, growth_interval: int, steps: int = 120,
           bad_every: int = 0) -> list[dict]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)  # x 1e3 loss: a gentle 1e-3
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale,
                                  growth_interval=growth_interval)
    g = torch.Generator().manual_seed(0)
    with Recorder(run, model=model, optimizer=opt, scaler=scaler, **FAST) as rec:
        for step in range(steps):
            x = torch.randn(16, 8, generator=g)
            out = model(x)
            loss = 1e3 * out.pow(2).mean()  # gradients of ~1e2: 2**127 x them overflows
            if bad_every and step > 20 and step % bad_every == 0:
                # a finite loss whose gradient is not: sqrt's slope at exactly 0
                loss = loss + (out * 0).abs().sqrt().mean()
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            rec.step(loss=loss)
    s = build_summary(run)
    return [f for f in s["findings"] if f["id"] == "nonfinite"]


def test_calibrating_from_a_huge_scale_is_info(tmp_path: Path) -> None:
    # 2**127 x gradients of ~1e2 overflows float32 for the first several steps
    (f,) = _train(tmp_path / "run", init_scale=2.0**127, growth_interval=10_000)
    assert f["severity"] == "info", f
    ev = f["evidence"]
    assert ev["amp_skipped_steps"] >= 6  # many more than 5% of the steps would allow...
    assert ev["amp_calibration_skips"] == ev["amp_skipped_steps"]  # ...all calibration


def test_growth_probes_are_info(tmp_path: Path) -> None:
    # grows every 4 applied steps from a scale just under overflow: it keeps probing a
    # doubled scale that overflows once, halves, and grows again (~20% of steps skipped)
    (f,) = _train(tmp_path / "run", init_scale=2.0**118, growth_interval=4)
    ev = f["evidence"]
    assert ev["amp_skipped_steps"] > 0.1 * 120, ev
    assert f["severity"] == "info", f


def test_gradients_that_keep_overflowing_are_a_warning(tmp_path: Path) -> None:
    (f,) = _train(tmp_path / "run", init_scale=2.0**16, growth_interval=10_000,
                  bad_every=5)
    assert f["severity"] == "warning", f
    assert f["evidence"]["amp_skipped_steps"] >= 15
    assert f["evidence"]["amp_calibration_skips"] == 0
