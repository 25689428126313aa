"""A loss whose per-batch values are heavy-tailed by the data is (almost never) a loss_spike
(#45): Student-t, lognormal or Pareto batch losses put batches 5-12x above the local level into
every run, each back at the level on the next steps and in a continuum of sizes with the steps
under the bar.
Spikes that did damage (the loss stays up for the next steps while the model climbs back) or
that stand an order of magnitude beyond everything else (an overflow, a corrupt batch) are
still found, in the same heavy-tailed data."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run

N = 400
S = np.arange(N)


def _curve() -> np.ndarray:
    return 0.3 + 1.5 * np.exp(-S / 80)


def _heavy(rng: np.random.Generator, kind: str) -> np.ndarray:
    """Per-batch multiplicative noise with a heavy right tail (median ~1)."""
    if kind == "lognormal":
        return np.exp(rng.normal(0, 0.6, N))
    if kind == "student_t":  # a batch mean of squared Student-t (df 2.5) residuals
        return np.mean(rng.standard_t(2.5, (N, 8)) ** 2, axis=1) / 1.4
    return 0.6 * (1 + rng.pareto(1.6, N))  # pareto


def _spikes(tmp_path, loss: np.ndarray) -> list[dict]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    run = make_run(tmp_path, steps=N, loss=loss, lr=1e-3)
    return [f for f in build_summary(run)["findings"] if f["id"] == "loss_spike"]


# Measured over seeds 100-119 (not these): lognormal 0/20 false alarms, Student-t 3/20,
# Pareto 3/20 (each a single draw more than APART times beyond every other: data with an
# infinite-variance tail does that, and a batch 5x beyond the run's others is worth a look);
# the analyzer before this rule: 20/20 for each.
@pytest.mark.parametrize(("kind", "most"), [("lognormal", 0), ("student_t", 2), ("pareto", 2)])
def test_heavy_tailed_batches_are_rarely_spikes(tmp_path, kind, most):
    alarms = []
    for seed in range(12):
        loss = _curve() * _heavy(np.random.default_rng(seed), kind)
        got = _spikes(tmp_path / str(seed), loss)
        alarms += [(seed, f["title"]) for f in got if f["severity"] != "info"]
    assert len(alarms) <= most, alarms


@pytest.mark.parametrize("kind", ["lognormal", "pareto"])
def test_an_overflow_in_heavy_tailed_data_stands_apart(tmp_path, kind):
    """Three steps whose loss is x1e4 (an fp16 overflow, a unit bug) in the same data."""
    loss = _curve() * _heavy(np.random.default_rng(11), kind)
    for s in (157, 158, 311):
        loss[s] *= 1e4
    found = [f for f in _spikes(tmp_path, loss) if f["severity"] != "info"]
    assert found and found[0]["first_step"] == 157, [(f["severity"], f["first_step"])
                                                     for f in found]


@pytest.mark.parametrize("seed", range(3))
def test_spikes_that_knock_the_model_back_are_found_in_heavy_tailed_data(tmp_path, seed):
    """Three instabilities (Adam's state lost, the LR too high): the loss x20 at one step,
    then climbing back down over ~40 steps."""
    rng = np.random.default_rng(20 + seed)
    loss = _curve() * np.exp(rng.normal(0, 0.3, N))
    for at in (121, 241, 361):
        loss[at:at + 40] += 20 * _curve()[at] * np.exp(-np.arange(min(40, N - at)) / 8)
    found = [f for f in _spikes(tmp_path, loss) if f["severity"] != "info"]
    assert found and found[0]["first_step"] == 121, [(f["severity"], f["first_step"])
                                                     for f in found]
