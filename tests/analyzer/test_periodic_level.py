"""stats/periodic.phase_level: a loop's structure whose single deviations are too small to be
spikes (a second task whose loss is 3x the first's under a CNN's ±70% per-batch noise), and
pure noise or accidents that keep no appointment (issue 45, item 2)."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary
from tracealyze.analyzer.stats import robust
from tracealyze.analyzer.stats.periodic import phase_level

from tests.runfactory import make_run


def _dev(x: np.ndarray) -> tuple[np.ndarray, float]:
    d = x - robust.rolling_median(x, 51)
    return d, robust.mad_sigma(d)


@pytest.mark.parametrize("seed", range(30))
def test_a_task_every_kth_step_is_found_under_heavy_noise(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(200, 2000))
    period = int(rng.integers(2, 9))
    phase = int(rng.integers(0, period))
    step = np.arange(n)
    noise = float(rng.uniform(0.03, 0.7))            # per-batch noise of the log loss
    x = -step / n + rng.standard_t(4, n) * noise   # a falling log loss
    x[step % period == phase] += np.log(rng.uniform(2.5, 6.0))
    p = phase_level(step, *_dev(x))
    assert p is not None and p.period == period and p.phases == (phase,), (period, phase, p)


@pytest.mark.parametrize("seed", range(60))
def test_noise_and_accidents_keep_no_appointment(seed: int) -> None:
    rng = np.random.default_rng(500 + seed)
    n = int(rng.integers(150, 3000))
    step = np.arange(n)
    x = -step / n + rng.standard_t(3, n) * rng.uniform(0.02, 0.8)
    if seed % 3 == 1:  # a handful of bad batches
        x[rng.choice(n, 6, replace=False)] += np.log(50)
    elif seed % 3 == 2:  # a divergence in the last fifth
        x[4 * n // 5:] += np.linspace(0, 4, n - 4 * n // 5)
    assert phase_level(step, *_dev(x)) is None


@pytest.mark.parametrize("seed", range(3))
def test_a_multitask_loop_under_cnn_noise_is_the_loops_structure(tmp_path, seed):
    """Only a few of task B's steps clear the spike bar: they are its structure. (Spikes of
    the lognormal noise elsewhere stay what they are.)"""
    rng = np.random.default_rng(seed)
    s = np.arange(300)
    loss = (0.3 + 2.0 * np.exp(-s / 60)) * np.exp(rng.normal(0, 0.6, 300))
    loss[s % 4 == 3] *= 3.0
    fs = build_summary(make_run(tmp_path, steps=300, loss=loss))["findings"]
    spikes = [f for f in fs if f["id"] == "loss_spike"]
    assert spikes
    for f in spikes:
        if f["severity"] == "info":
            assert f["evidence"]["period"] == 4 and f["evidence"]["phases"] == [3]
        else:
            assert all(st % 4 != 3 for st in f["evidence"]["spike_steps"]), f
