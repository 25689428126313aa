"""memory_leak's onset on generated series: a leak that runs from inside the warm-up the
statistics skip is dated where it began, and a warm-up that settled is not read as one."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis import thresholds
from tracealyze.analyzer.diagnosis.detectors import memory_leak

TH = thresholds.of(memory_leak)
MB = 1 << 20


def series(n: int, onset: int, rate: float, noise: float, seed: int,
           warm: list[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A counter at 2 GB, a leak of ``rate`` bytes a step whose first effect shows in the
    row of step ``onset`` (as the recorder reads at each step's end), optional warm-up
    allocations (bytes added at steps 0, 1, ...), Gaussian noise."""
    rng = np.random.default_rng(seed)
    step = np.arange(n)
    val = 2e9 + rate * np.clip(step - onset + 1, 0, None) + rng.normal(0, noise, n)
    for i, extra in enumerate(warm or []):
        val[i:] += extra
    return step, val


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("onset", [0, 1, 4])
def test_a_leak_from_inside_the_warmup_is_dated_there(onset: int, seed: int) -> None:
    step, val = series(200, onset, 3 * MB, 0.05 * MB, seed)
    res = memory_leak._analyse(step, val, TH, precise=True)
    assert res is not None
    # the detector's convention: the step before the first row that shows the leak
    assert abs(res["first_step"] - max(onset - 1, 0)) <= 1, res["first_step"]
    assert res["start"] < 2e9 + 3 * MB * 3  # the level quoted is the onset's, not step 20's


@pytest.mark.parametrize("seed", range(5))
def test_a_settled_warmup_is_not_the_leak(seed: int) -> None:
    # optimizer state and caches allocated in the first steps, flat, then a leak from 60
    step, val = series(300, 60, 3 * MB, 0.05 * MB, seed, warm=[400 * MB, 50 * MB, 10 * MB])
    res = memory_leak._analyse(step, val, TH, precise=True)
    assert res is not None and abs(res["first_step"] - 59) <= 2, res["first_step"]


@pytest.mark.parametrize("seed", range(5))
def test_warmup_growth_then_a_leak_from_the_boundary_stops_at_the_flat_steps(
        seed: int) -> None:
    # warm-up allocations at 0-2, three flat steps, then a leak from step 6
    step, val = series(200, 6, 3 * MB, 0.05 * MB, seed, warm=[400 * MB, 50 * MB, 10 * MB])
    res = memory_leak._analyse(step, val, TH, precise=True)
    assert res is not None and abs(res["first_step"] - 5) <= 1, res["first_step"]


def test_into_warmup_walks_back_over_rising_steps_only() -> None:
    step = np.arange(8)
    val = np.array([0, 0, 0, 10, 20, 30, 40, 50], dtype=float)
    assert memory_leak.into_warmup(step, val, 5, 10.0) == 2
    assert memory_leak.into_warmup(step, val, 1, 10.0) == 1  # nothing rose before it
    # rows every 2 steps: the rise is per step
    assert memory_leak.into_warmup(step[::2], val[::2] * 2, 6, 10.0) == 2


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("onset", [60, 150, 200])
def test_the_rate_is_the_leaks_own_since_it_began(onset: int, seed: int) -> None:
    rate = 320 * 1024  # a flat stretch before the onset must not average it down
    step, val = series(300, onset, rate, 0.02 * MB, seed)
    val = val - 2e9 + 125 * MB  # a process's malloc heap, judged as the detector judges it
    res = memory_leak._analyse(step, val, TH, TH.min_growth_heap_bytes,
                               TH.min_growth_heap_frac, precise=True)
    assert res is not None and abs(res["first_step"] - (onset - 1)) <= 2
    assert abs(res["slope"] / rate - 1) < 0.05, res["slope"] / rate
    assert abs(res["growth"] - (res["end"] - res["start"])) < 1  # the message's own numbers
