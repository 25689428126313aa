"""stats/periodic.phase_pattern: structure by design against accidents, on generated series
with known answers (issue 45, item 2)."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.stats.periodic import phase_pattern

Z = 8.0


def _noise(rng: np.random.Generator, n: int) -> np.ndarray:
    # heavy-tailed, as per-batch losses are: Student-t with 3 degrees of freedom
    return rng.standard_t(3, n) * 0.7


@pytest.mark.parametrize("seed", range(40))
def test_a_recurring_rise_is_found_at_its_own_period(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(150, 2000))
    period = int(rng.integers(2, 41))
    if n // period < 6:
        period = max(2, n // 6)
    phase = int(rng.integers(0, period))
    step = np.arange(n)
    z = _noise(rng, n)
    on = step % period == phase
    # most cycles show it; some do not (a task skipped, a short batch)
    keep = rng.random(n) > 0.15
    z[on & keep] += rng.uniform(15, 60)
    p = phase_pattern(step, z, Z)
    assert p is not None and p.period == period and p.phases == (phase,), (period, phase, p)
    assert p.explains(int(step[on][0])) and not p.explains(int(step[~on][0]))


@pytest.mark.parametrize("seed", range(40))
def test_accidents_keep_no_appointment(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(100, 3000))
    step = np.arange(n)
    z = _noise(rng, n)
    k = int(rng.integers(1, max(2, n // 20)))  # up to 5% of the steps spike, anywhere
    z[rng.choice(n, size=k, replace=False)] += rng.uniform(10, 100, size=k)
    assert phase_pattern(step, z, Z) is None


def test_three_cycles_are_not_enough() -> None:
    step = np.arange(120)
    z = np.zeros(120)
    z[[10, 50, 90]] = 50.0  # a period of 40, seen three times
    assert phase_pattern(step, z, Z) is None
    z[[10, 50, 90]] = 50.0
    step2 = np.arange(170)
    z2 = np.zeros(170)
    z2[[10, 50, 90, 130]] = 50.0
    p = phase_pattern(step2, z2, Z)
    assert p is not None and p.period == 40 and p.phases == (10,)


def test_sparse_recording_and_nan() -> None:
    step = np.arange(0, 800, 2)  # memory/loss recorded every 2nd step
    z = np.zeros(len(step))
    z[step % 16 == 6] = 30.0
    z[5] = np.nan
    p = phase_pattern(step, z, Z)
    assert p is not None and p.period == 16 and p.phases == (6,)


def test_a_level_is_not_an_appointment() -> None:
    step = np.arange(400)
    assert phase_pattern(step, np.full(400, 20.0), Z) is None  # high everywhere: a level
    z = np.full(400, 20.0)
    z[step % 3 == 0] = 0.0  # two phases of three high, whatever the period looked at
    assert phase_pattern(step, z, Z) is None


def test_a_growing_series_keeps_no_appointment() -> None:
    """A divergence's residuals grow by orders of magnitude: even where they fall on one
    phase, they are not a design repeated at the same size."""
    step = np.arange(36)
    z = np.zeros(36)
    z[step % 4 == 3] = 10.0 ** (1 + step[step % 4 == 3] / 4)
    assert phase_pattern(step, z, Z) is None


def test_spikes_that_all_keep_one_phase_are_an_appointment() -> None:
    """A round-robin loop of 3 tasks whose first task's loss is far above the others' until
    it learns (8 spikes over the first 35 steps, all at step mod 3 = 0): the loop's."""
    from tracealyze.analyzer.stats.periodic import one_phase

    got = one_phase(np.array([3, 6, 12, 15, 18, 27, 30, 33]))
    assert got is not None and got.period == 3 and got.phases == (0,)


@pytest.mark.parametrize("seed", range(30))
def test_random_spikes_are_no_appointment(seed: int) -> None:
    """4-12 spikes at random steps of a 300-step run (an unstable learning rate): chance
    puts a few on one parity, never all of them with the appointment kept."""
    from tracealyze.analyzer.stats.periodic import one_phase

    rng = np.random.default_rng(seed)
    k = int(rng.integers(4, 13))
    assert one_phase(np.sort(rng.choice(np.arange(300), k, replace=False))) is None


def test_four_spikes_on_one_parity_are_chance() -> None:
    from tracealyze.analyzer.stats.periodic import one_phase

    assert one_phase(np.array([10, 14, 22, 30])) is None  # 2^-3 = 0.125
