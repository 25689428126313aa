"""A scheduled weight of the objective (_weights.py): a VAE whose KL weight β ramps 0 -> 4
over steps 60-200 raises its total loss by design; that is no divergence and no plateau.
A divergence after the weight settled is still one, and a counter or a noisy metric is no
weight."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from tracealyze.recorder import Recorder

from tests.scenarios import checks

STEPS = 300


def _vae(run: Path, *, ramp: bool, lr_jump_at: int | None = None) -> dict:
    """A small VAE on 16-D data of rank 4; loss = reconstruction + β·KL, β logged."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    basis = torch.randn(4, 16, generator=g)
    model = nn.ModuleDict({
        "enc": nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 8)),
        "dec": nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 16))})
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    with Recorder(run, model=model, optimizer=opt, profile_start=0,
                  system_interval_s=0) as rec:
        for i in range(STEPS):
            if lr_jump_at is not None and i == lr_jump_at:
                for group in opt.param_groups:
                    group["lr"] *= 30
            x = torch.randn(64, 4, generator=g) @ basis + 0.1 * torch.randn(64, 16, generator=g)
            mu, logvar = model["enc"](x).chunk(2, dim=1)
            z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
            recon = (model["dec"](z) - x).pow(2).sum(1).mean()
            kl = 0.5 * (mu.pow(2) + logvar.exp() - 1 - logvar).sum(1).mean()
            beta = 4.0 * min(1.0, max(0.0, (i - 60) / 140)) if ramp else 4.0
            loss = recon + beta * kl
            opt.zero_grad()
            loss.backward()
            opt.step()
            # (an epoch counter logged too: integer jumps, never a weight)
            rec.step(loss=loss, recon=recon, kl=kl, beta=beta, epoch=i // 40)
    return checks.summarize(run)


def _above(summary: dict, fid: str) -> list[dict]:
    return [f for f in checks.by_id(summary, fid) if f["severity"] != "info"]


def test_a_kl_weight_ramp_explains_the_rise(tmp_path: Path, monkeypatch) -> None:
    s = _vae(tmp_path / "run", ramp=True)
    assert not _above(s, "loss_divergence") and not _above(s, "loss_plateau"), s["findings"]
    (f,) = checks.by_id(s, "loss_divergence")
    w = f["evidence"]["weight"]
    assert w["name"] == "beta" and w["start"] == 60 and w["end"] == 200
    assert 60 <= f["first_step"] <= 200
    # the case is real: without the weight read, the same run is called a divergence
    from tracealyze.analyzer.diagnosis.detectors import _weights
    monkeypatch.setattr(_weights, "ramps", lambda ctx: [])
    assert _above(checks.summarize(tmp_path / "run"), "loss_divergence")


def test_a_divergence_after_the_weight_settled_is_one(tmp_path: Path) -> None:
    s = _vae(tmp_path / "run", ramp=True, lr_jump_at=230)
    (f,) = _above(s, "loss_divergence")
    assert f["severity"] == "error" and 225 <= f["first_step"] <= 240, f


@pytest.mark.parametrize("values, want", [
    (np.r_[np.zeros(50), np.linspace(0, 1, 100), np.ones(150)], (50, 149)),   # linear warm-up
    (10 * np.exp(-5 * (1 - np.minimum(np.arange(300), 250) / 250) ** 2), (0, 250)),  # sigmoid
    (np.r_[np.zeros(100), np.ones(200)], None),            # a switch: one jump
    (np.arange(300) // 40, None),                          # an epoch counter
    (np.arange(300) * 64.0, None),                         # samples seen: grows to the end
    (np.linspace(0.1, 0.5, 300), (0, None)),               # a ramp to the end (non-integer)
    (0.996 + 0.004 * np.linspace(0, 1, 300), None),        # BYOL's τ: rises ×1.004
    (np.abs(np.random.default_rng(0).normal(1, 0.1, 300)), None),  # a measured metric
])
def test_what_is_a_ramp(values: np.ndarray, want: tuple | None) -> None:
    from tracealyze.analyzer.diagnosis.detectors import _weights

    v = np.asarray(values, dtype=np.float64)
    got = _weights._ramp("w", np.arange(len(v)), v)
    assert (None if got is None else (got["start"], got["end"])) == want
