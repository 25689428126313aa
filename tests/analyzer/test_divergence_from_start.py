"""loss_divergence when the loss is worst-ever-after from step 0: a learning rate too high
from the start throws the model far above its initial loss, and it never comes back below it.
The smoothed start then holds the blow-up, so "fell to its best, then rose" cannot see it.
Shapes measured on the matrix's GRU language model at 100x its learning rate (seeds 1, 3, 4:
step 0 at ~4.18 = ln(64), 8+ by step 2, ~6 for 50 steps, ending at 4.4-4.6)."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run

N = 300
S = np.arange(N)


def _blown(seed: int, end: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    level = np.where(S < 2, 4.18, end + (6.3 - end) * np.exp(-np.maximum(S - 40, 0) / 70))
    loss = level + rng.normal(0, 0.4, N)
    loss[0] = 4.18 + rng.normal(0, 0.02)
    loss[2] = 8.3
    return loss


def _findings(run) -> dict[str, dict]:
    return {f["id"]: f for f in build_summary(run)["findings"]}


@pytest.mark.parametrize("seed", range(4))
def test_a_loss_that_never_comes_back_below_step_0_diverged(tmp_path, seed):
    fs = _findings(make_run(tmp_path, steps=N, loss=_blown(seed, end=4.5), lr=0.3))
    d = fs["loss_divergence"]
    assert d["severity"] == "error" and d["evidence"]["never_recovered"] is True
    assert d["first_step"] <= 3
    assert "never came back below where it started" in d["message"]
    assert "learning rate of 0.3" in d["message"]


@pytest.mark.parametrize("seed", range(4))
def test_a_blow_up_that_recovers_below_the_start_is_not_divergence(tmp_path, seed):
    fs = _findings(make_run(tmp_path, steps=N, loss=_blown(seed, end=2.0), lr=0.3))
    assert "loss_divergence" not in fs


@pytest.mark.parametrize("seed", range(4))
def test_a_loss_at_chance_throughout_is_not_divergence(tmp_path, seed):
    """Random labels: the loss stays at its initial (chance) level, noise either side."""
    loss = 4.16 + np.random.default_rng(seed).normal(0, 0.05, N)
    assert "loss_divergence" not in _findings(make_run(tmp_path, steps=N, loss=loss))


def test_a_resumed_run_has_no_initial_loss_to_compare(tmp_path):
    """Its first recorded step is not the model at initialisation."""
    run = make_run(tmp_path, steps=range(1000, 1000 + N), loss=_blown(0, end=4.5), lr=0.3)
    assert "loss_divergence" not in _findings(run)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("noise", ["chisquare", "lognormal"])
def test_a_noisy_loss_that_never_moved_from_a_low_first_draw_is_not_divergence(
        tmp_path, seed, noise):
    """A loss the model cannot reduce, with skewed per-step noise (a mean-squared error over
    16 random targets: chi-square, ~35% a step; or lognormal, 50%), step 0 drawn 1.5 sigma
    low: the smoothed level sits ~40-60% above step 0 without any blow-up."""
    rng = np.random.default_rng(seed)
    if noise == "chisquare":
        loss = 1.4 * rng.chisquare(16, 120) / 16
        loss[0] = 1.4 * (1 - 1.5 * np.sqrt(2 / 16))
    else:
        loss = 1.4 * np.exp(rng.normal(0, 0.5, 120))
        loss[0] = 1.4 * np.exp(-0.75)
    assert "loss_divergence" not in _findings(make_run(tmp_path, steps=120, loss=loss))


def test_a_long_run_compares_with_step_0_itself(tmp_path):
    """Past 2,000 steps the shape is read from bucket medians; the comparison still uses
    step 0's own loss, not the first bucket's median (which holds the blow-up)."""
    n = 6000
    s = np.arange(n)
    rng = np.random.default_rng(0)
    level = np.where(s < 40, 4.18, 4.5 + 1.8 * np.exp(-np.maximum(s - 800, 0) / 1400))
    loss = level + rng.normal(0, 0.4, n)
    loss[0] = 4.18
    loss[1:40] = 8.0 + rng.normal(0, 0.4, 39)
    d = _findings(make_run(tmp_path, steps=n, loss=loss, lr=0.3))["loss_divergence"]
    assert d["evidence"]["never_recovered"] is True and d["evidence"]["start_loss"] == 4.18
    assert d["first_step"] <= 3


def test_a_long_noisy_loss_that_never_moved_is_judged_by_one_step_s_noise(tmp_path):
    """40,000 steps of a flat chi-square loss from a low step 0: the bucket medians the
    shape is read from are nearly noiseless, but step 0 is one draw of the raw loss."""
    rng = np.random.default_rng(1)
    loss = 1.4 * rng.chisquare(16, 40_000) / 16
    loss[0] = 1.4 * (1 - 1.5 * np.sqrt(2 / 16))
    assert "loss_divergence" not in _findings(make_run(tmp_path, steps=40_000, loss=loss))
