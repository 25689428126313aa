"""Saturated bounded activations, end to end: the recorder's saturated share against a
numpy reference on generated tensors, and saturated_activation on trained models: a tanh
MLP whose first layer is scaled far up (named), the same MLP with Xavier init (nothing), a
binary classifier whose final sigmoid becomes confident (its output: nothing), and a
transformer block whose nn.Softmax attention goes peaked (info at most)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from tracealyze.analyzer.diagnosis.summary import build_summary
from tracealyze.recorder import Recorder
from tracealyze.recorder.tensors.saturation import bound_kind, saturated_share


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.floats(0.1, 20.0),
       module=st.sampled_from(["tanh", "sigmoid", "hardtanh", "relu6", "softmax"]))
def test_saturated_share_is_the_reference(seed: int, scale: float, module: str) -> None:
    mods = {"tanh": nn.Tanh(), "sigmoid": nn.Sigmoid(), "hardtanh": nn.Hardtanh(-2.0, 3.0),
            "relu6": nn.ReLU6(), "softmax": nn.Softmax(dim=-1)}
    m = mods[module]
    x = torch.randn(7, 13, generator=torch.Generator().manual_seed(seed)) * scale
    y = m(x)
    got = float(saturated_share(y, bound_kind(m)))
    a = y.numpy().astype(np.float64)
    if module == "softmax":
        want = np.mean(a.max(axis=-1) >= 0.99)
    else:
        lo, hi = {"tanh": (-1, 1), "sigmoid": (0, 1), "hardtanh": (-2, 3),
                  "relu6": (None, 6)}[module]
        span = (hi - lo) if lo is not None else hi
        sat = a >= hi - 0.01 * span
        if lo is not None:
            sat |= a <= lo + 0.01 * span
        want = np.mean(sat)
    assert got == pytest.approx(want, abs=1e-6)


def _train(run: Path, model: nn.Module, data, loss_fn, steps: int = 200,
           lr: float = 1e-2) -> dict:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with Recorder(run, model=model, optimizer=opt, preset="debug", flush_interval_s=0.5,
                  profile_start=0, system_interval_s=0) as rec:
        for i in range(steps):
            x, y = data(i)
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    return build_summary(run)


def _regression(i: int):
    g = torch.Generator().manual_seed(i)
    x = torch.randn(32, 16, generator=g)
    return x, x[:, :4].sum(dim=1, keepdim=True)


def _mlp(scale: float) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 32), nn.Tanh(),
                      nn.Linear(32, 1))
    for layer in (m[0], m[2], m[4]):
        nn.init.xavier_uniform_(layer.weight)
    with torch.no_grad():
        m[0].weight.mul_(scale)
    return m


def _sat(summary: dict) -> list[dict]:
    return [f for f in summary["findings"] if f["id"] == "saturated_activation"]


def test_a_tanh_driven_to_its_bounds_is_named(tmp_path: Path) -> None:
    found = _sat(_train(tmp_path / "run", _mlp(40.0), _regression, nn.functional.mse_loss))
    assert len(found) == 1, found
    f = found[0]
    assert f["severity"] == "warning" and f["subject"] == "1"
    assert f["evidence"]["kind"] == "tanh" and f["evidence"]["sat_frac"] >= 0.5


def test_a_well_initialised_tanh_mlp_has_none(tmp_path: Path) -> None:
    assert _sat(_train(tmp_path / "run", _mlp(1.0), _regression,
                       nn.functional.mse_loss)) == []


def test_a_confident_sigmoid_output_is_not_saturation(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid())

    def data(i: int):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(64, 8, generator=g)
        return x, (x[:, 0] > 0).float().unsqueeze(1)

    summary = _train(tmp_path / "run", model, data, nn.functional.binary_cross_entropy,
                     steps=300, lr=0.5)
    run = tmp_path / "run"
    out = json.loads(__import__("subprocess").run(
        [__import__("sys").executable, "-c",
         "from tracealyze.analyzer.cli import main; main()", "query", str(run),
         "SELECT max(sat_frac) AS s FROM tensor_stats WHERE name = '3'", "--format", "json"],
        capture_output=True, text=True, check=True).stdout)
    assert out[0]["s"] is not None and out[0]["s"] > 0.5  # it did become confident
    assert _sat(summary) == []


class _Block(nn.Module):
    """A pre-norm transformer block whose attention is an nn.Softmax module."""

    def __init__(self, d: int = 32, temp: float = 1.0) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.softmax = nn.Softmax(dim=-1)
        self.proj = nn.Linear(d, d)
        self.head = nn.Linear(d, 1)
        self.temp = temp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
        att = self.softmax(q @ k.transpose(-2, -1) * self.temp)
        return self.head((x + self.proj(att @ v)).mean(dim=1))


def test_peaked_softmax_attention_is_info_at_most(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _Block(temp=50.0)  # a very low temperature: near one-hot attention

    def data(i: int):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(16, 12, 32, generator=g)
        return x, x[:, :, 0].mean(dim=1, keepdim=True)

    found = _sat(_train(tmp_path / "run", model, data, nn.functional.mse_loss))
    assert found and all(f["severity"] == "info" for f in found)
    assert found[0]["subject"] == "softmax"


def test_a_saturation_episode_that_ended_is_dated_at_its_start(tmp_path: Path) -> None:
    """Inputs at ×1e4 for steps 60-159 (a normaliser refitted on a stuck sensor, then
    refitted again): the tanh saturates for that stretch only; the last half of the run is
    fine, so the rule over it says nothing, the episode does."""
    def data(i: int):
        x, y = _regression(i)
        return (x * 1e4 if 60 <= i < 160 else x), y

    found = _sat(_train(tmp_path / "run", _mlp(1.0), data, nn.functional.mse_loss,
                        steps=300, lr=1e-3))
    assert len(found) == 1, found
    f = found[0]
    assert f["severity"] == "warning" and f["subject"] == "1"
    # (activation statistics every 25 steps in debug: the first inside the stretch)
    assert 60 <= f["first_step"] <= 85, f
    assert 160 <= f["evidence"]["until_step"] <= 185, f


@pytest.mark.parametrize("sat, want", [
    # mid-run stretch of 4 statistics points over 100 of 450 steps: dated at its start
    ([0.02] * 8 + [1.0] * 4 + [0.05] * 6, (200, 300)),
    # the same stretch present from initialisation: the init's scale learned away
    ([1.0] * 4 + [0.02] * 14, None),
    # two saturated points: one odd stretch of batches, not an episode
    ([0.02] * 8 + [1.0] * 2 + [0.05] * 8, None),
    # saturated to the end: an episode with no end
    ([0.02] * 14 + [0.9] * 4, (350, None)),
])
def test_episode_rule(sat: list[float], want: tuple | None) -> None:
    from tracealyze.analyzer.diagnosis.detectors import saturated_activation as sa
    from tracealyze.analyzer.diagnosis.thresholds import of

    steps = np.arange(len(sat), dtype=np.float64) * 25
    th = of(sa)
    got = sa._episode(steps, np.asarray(sat), th, 449.0)
    assert (got[:2] if got else None) == want
