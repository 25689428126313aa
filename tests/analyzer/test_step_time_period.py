"""step_time_outlier's schedule (issue 45, item 6): a stall the training makes every N steps
is found as every N, dated at its first, among the noise-slow steps of a busy machine."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.detectors.step_time_outlier import _period
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run


def _noisy_steps(rng: np.random.Generator, n: int, slow_frac: float) -> np.ndarray:
    """Step durations of a 3-5 ms loop on a shared 2-core machine: a share of the steps
    2-5x slower, at random."""
    d = 0.004 * np.exp(rng.normal(0, 0.1, n))
    slow = rng.random(n) < slow_frac
    d[slow] *= rng.uniform(2, 5, slow.sum())
    return d


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("every", [25, 40, 50])
def test_a_checkpoint_every_n_steps_is_every_n_among_noise_slow_steps(every, seed):
    rng = np.random.default_rng(seed)
    n = 300
    d = _noisy_steps(rng, n, 0.3)
    first = every - 1 + int(rng.integers(0, 5))
    d[first::every] += 0.3
    med = float(np.median(d))
    slow = np.flatnonzero(d > 1.8 * med)
    assert _period(slow, d[slow] - med, np.arange(n)) == (every, first % every)


@pytest.mark.parametrize("seed", range(8))
def test_irregular_stalls_have_no_schedule(seed):
    """Four pauses at irregular steps (a filesystem hiccup), even when three of them happen
    to be equally spaced: no period (two accidents at one phase prove nothing; four do)."""
    rng = np.random.default_rng(100 + seed)
    n = 300
    d = _noisy_steps(rng, n, 0.3)
    at = [60, 110, 170, 230] if seed == 0 else sorted(rng.choice(np.arange(10, n), 4, False))
    d[at] += 0.4
    med = float(np.median(d))
    slow = np.flatnonzero(d > 1.8 * med)
    assert _period(slow, d[slow] - med, np.arange(n)) is None


def test_the_finding_leads_with_the_schedule(tmp_path):
    rng = np.random.default_rng(3)
    d = _noisy_steps(rng, 300, 0.2)
    d[49::50] += 0.3
    run = make_run(tmp_path, steps=300, duration=d, data_wait=np.zeros(300))
    (f,) = [f for f in build_summary(run)["findings"] if f["id"] == "step_time_outlier"]
    assert f["first_step"] == 49 and f["evidence"]["period_steps"] == 50
    assert f["title"].startswith("6 stalls every 50 steps"), f["title"]


def test_a_schedule_that_costs_a_third_of_a_short_run_is_a_warning(tmp_path):
    """An evaluation pass every 25 steps of a 200-step run: 8 x 70 ms on 4 ms steps, 0.5 s
    in all (under min_excess_s) but a third of the run's time: a schedule of costly stalls
    is no noise, its share decides."""
    d = np.full(200, 0.004)
    d[24::25] = 0.07
    run = make_run(tmp_path, steps=200, duration=d, data_wait=np.zeros(200))
    (f,) = [f for f in build_summary(run)["findings"] if f["id"] == "step_time_outlier"]
    assert f["severity"] == "warning" and f["first_step"] == 24
    assert f["evidence"]["period_steps"] == 25
