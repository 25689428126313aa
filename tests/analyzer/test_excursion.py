"""A spike is one step's rise; the top of a climb is not (#45: stats/excursion.py, loss_spike).

Property tests on generated series: single batches (alone, or with the knocked model's next
step higher still) at random steps and noise levels are one step's doing; climbs that grow
geometrically or linearly over several steps and come back (a full-batch run at the edge of
stability) are not, whatever their height. Then the detector on both, in one run."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.detectors.loss_spike import level_before
from tracealyze.analyzer.diagnosis.summary import build_summary
from tracealyze.analyzer.stats.excursion import single_step

from tests.runfactory import make_run

H = 25  # loss_spike's half window


def _base(rng: np.random.Generator, n: int, noise: float) -> np.ndarray:
    return (0.5 + 2.0 * np.exp(-np.arange(n) / 60)) * np.exp(rng.normal(0, noise, n))


@pytest.mark.parametrize("seed", range(40))
def test_a_batch_is_one_steps_rise(seed):
    rng = np.random.default_rng(seed)
    noise = rng.uniform(0.0, 0.15)
    x = _base(rng, 300, noise)
    at = int(rng.integers(60, 290))
    x[at] *= rng.uniform(3, 300)
    if seed % 2:  # the knocked model climbs once more on the next step, at most as much
        x[at + 1] = x[at] + rng.uniform(0, 1) * (x[at] - x[at - 1])
    lv = level_before(x, H)
    idx = np.array([at, at + 1]) if seed % 2 else np.array([at])
    assert single_step(x, lv, idx, H).all()


@pytest.mark.parametrize("seed", range(40))
def test_the_top_of_a_climb_is_no_batch(seed):
    rng = np.random.default_rng(seed)
    noise = rng.uniform(0.0, 0.03)
    x = _base(rng, 300, noise)
    at = int(rng.integers(60, 250))
    height = rng.uniform(1.5, 20)            # its top, times the level
    # steps of the climb (never x1.6 a step or faster: doubling each step is sharp)
    up = max(int(rng.integers(4, 25)), int(np.ceil(np.log(height) / np.log(1.6))))
    shape = (np.geomspace(1, height, up + 1) if seed % 2
             else np.linspace(1, height, up + 1))[1:]
    down = np.geomspace(height, 1, int(rng.integers(3, 15)))[1:]
    bump = np.concatenate([shape, down])
    x[at:at + len(bump)] *= bump
    lv = level_before(x, H)
    # its highest points, up and down (those a spike test could flag: above half its top)
    idx = at + np.flatnonzero(bump >= (1 + height) / 2)
    assert not single_step(x, lv, idx, H).any()


def test_nothing_before_the_first_step():
    x = np.array([5.0, 1.0, 1.0])
    assert single_step(x, level_before(x, H), np.array([0]), H).all()


def _spikes(run) -> list[dict]:
    return [f for f in build_summary(run)["findings"] if f["id"] == "loss_spike"]


def test_a_full_batch_catapult_is_not_a_spike(tmp_path):
    """The held-out SGDR run's shape: a noiseless falling loss climbs x2.4 over 20 steps
    (each ~5% above the last) and comes back: no batch threw it, no spike is reported."""
    s = np.arange(500)
    loss = 0.01 + 0.1 * np.exp(-s / 20)
    bump = np.concatenate([np.geomspace(1, 2.4, 21)[1:], np.geomspace(2.4, 1, 10)[1:]])
    loss[276:276 + len(bump)] *= bump
    assert _spikes(make_run(tmp_path, steps=500, loss=loss)) == []


def test_one_batch_on_the_same_run_is_a_spike_at_its_step(tmp_path):
    s = np.arange(500)
    loss = 0.01 + 0.1 * np.exp(-s / 20)
    loss[296] *= 2.4
    (f,) = _spikes(make_run(tmp_path, steps=500, loss=loss))
    assert f["first_step"] == 296 and f["severity"] != "info"
