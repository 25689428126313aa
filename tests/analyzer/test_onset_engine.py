"""The onset engine (analyzer/stats/onset.py) on generated series with known onsets: at the
run's start, mid-run and in its last 5%, at the noise of real runs. A sharp change (a jump)
is dated to its step; a gradual one (geometric growth, a steady drift) within 5% of the
run; a series without a change, or a cache that fills ever more slowly, has no onset."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tracealyze.analyzer.stats import onset as eng

N = 300
TOL = int(0.05 * N)  # the issue's ±5% of the run for gradual events
LN10 = math.log(10)
# Step-to-step noise of a log gradient norm in the matrix's healthy runs: σ ≈ 0.05 (a large
# model's total norm) to 0.3 (a small tensor's). Memory counters: noise a tenth to a third
# of a leak's per-step rate.
LOG_NOISE = (0.05, 0.15, 0.3)
ONSETS = (0, N // 2, N - N // 20)  # the start, mid-run, the last 5%


def _steps() -> np.ndarray:
    return np.arange(N, dtype=np.int64) + 1000  # steps need not start at 0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("sigma", LOG_NOISE)
@pytest.mark.parametrize("t0", ONSETS)
def test_geometric_growth_is_dated_where_the_rate_changed(t0: int, sigma: float,
                                                          seed: int) -> None:
    rng = np.random.default_rng(seed)
    t = np.arange(N)
    rate = 0.3 if t0 >= N - N // 20 else 0.05  # ×1.35 a step late, ×1.05 mid-run/at start
    x = rng.normal(0.0, sigma, N) + rate * np.clip(t - t0, 0, None)
    o = eng.growth_onset(_steps(), x, LN10)
    assert o is not None and o.kind == "growth"
    assert abs(o.index - t0) <= TOL, (o.index, t0)
    assert o.step == 1000 + o.index


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("sigma", LOG_NOISE)
@pytest.mark.parametrize("t0", (5, N // 2, N - N // 20))
def test_a_jump_is_dated_to_its_step(t0: int, sigma: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, sigma, N)
    x[t0:] += math.log(1e3)  # one step multiplies the norm 1000× and it stays there
    o = eng.jump_onset(_steps(), x, LN10)
    assert o is not None and o.index == t0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("noise", (0.1, 0.3))
@pytest.mark.parametrize("t0", ONSETS)
def test_a_steady_drift_is_dated_where_it_began(t0: int, noise: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    t = np.arange(N)
    rate = 80e3  # bytes a step: a small model's loss kept with its graph
    x = 2e9 + rate * np.clip(t - t0 + 1, 0, None) + rng.normal(0, noise * rate, N)
    o = eng.drift_onset(_steps(), x)
    assert o is not None and o.kind == "drift"
    # (the convention of memory_leak: the step before the first row that shows it; a
    # drift is gradual, ±5% of the run, and within 2 steps when the noise is small)
    assert abs(o.index - max(t0 - 1, 0)) <= (2 if noise <= 0.1 else TOL), (o.index, t0)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("sigma", LOG_NOISE)
def test_noise_alone_has_no_onset(sigma: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, sigma, N)
    assert eng.onsets(_steps(), x) == []
    assert eng.drift_onset(_steps(), 2e9 + rng.normal(0, 50e3, N)) is None


@pytest.mark.parametrize("seed", range(4))
def test_a_cache_filling_ever_more_slowly_is_no_drift(seed: int) -> None:
    rng = np.random.default_rng(seed)
    t = np.arange(N)
    x = 2e9 + 100e6 * (1 - np.exp(-t / 60)) + rng.normal(0, 20e3, N)
    assert eng.drift_onset(_steps(), x) is None


def test_onsets_lists_each_kind_in_step_order() -> None:
    rng = np.random.default_rng(0)
    t = np.arange(N)
    x = rng.normal(0.0, 0.05, N) + 0.05 * np.clip(t - 200, 0, None)
    x[100:] += math.log(1e3)  # a batch at 100 throws the norm up; growth from 200
    found = eng.onsets(_steps(), x)
    assert found[0].kind == "jump" and found[0].index == 100
    assert any(o.kind == "growth" and abs(o.index - 200) <= TOL for o in found), found


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("fill_rate", (0.5, 6.0))
def test_the_final_rise_starts_after_a_warmup_that_filled_and_stopped(fill_rate: float,
                                                                      seed: int) -> None:
    # floors of a counter: a warm-up fill (faster than the leak, or slower), a flat level,
    # then the leak's steady rise to the end from window 30 of 50
    rng = np.random.default_rng(seed)
    t = np.arange(50, dtype=np.float64)
    y = fill_rate * np.minimum(t, 8) + 1.0 * np.clip(t - 30, 0, None) + rng.normal(0, 0.05, 50)
    tau = eng.regime_start(t * 6, y)
    assert tau is not None and abs(tau - 30) <= 1, tau


def test_a_staircase_from_the_start_is_one_regime() -> None:
    # +1 every 2 windows from the first: the rise runs from the start
    y = np.floor(np.arange(50) / 2).astype(np.float64)
    assert eng.regime_start(np.arange(50.0) * 5, y) == 0
    assert eng.regime_start(np.arange(50.0), np.zeros(50)) is None  # no rise at all


@pytest.mark.parametrize("period", (1, 7, 10, 25))
def test_a_drift_in_stairs_is_followed_back_along_its_line(period: int) -> None:
    # +period·100 KiB every ``period`` steps from step 0, with a little noise; dated at
    # step 30 (where a detector's statistics begin), it is walked back to the start
    rng = np.random.default_rng(period)
    step = np.arange(N)
    val = 2e9 + 100e3 * period * (step // period) + rng.normal(0, 2e3, N)
    assert eng.along_line(step, val, 30, 100e3) <= period
    # a flat warm-up before a drift from 60 stops the walk where the drift began
    flat = 2e9 + 100e3 * np.clip(step - 60, 0, None) + rng.normal(0, 2e3, N)
    assert abs(eng.along_line(step, flat, 90, 100e3) - 60) <= 2


def _loss_then(rng: np.random.Generator, t0: int, after: np.ndarray, sigma: float
               ) -> np.ndarray:
    """A loss that falls to a floor of 1.0, then from ``t0`` is multiplied by ``after``."""
    s = np.arange(N)
    y = 1.0 + 2.0 * np.exp(-s / 20) * (s < t0)
    y[t0:] *= after[:N - t0]
    return y * np.exp(rng.normal(0, sigma, N))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("sigma", (0.02, 0.05, 0.1))
@pytest.mark.parametrize("t0", (N // 3, N // 2, N - N // 20))
def test_a_departure_by_a_jump_is_dated_to_its_step(t0: int, sigma: float, seed: int) -> None:
    """The loss leaves its best level at one step (x3, and stays): the departure is that
    step, though the smoothed series crosses half a window later."""
    from tracealyze.analyzer.stats import robust

    rng = np.random.default_rng(seed)
    raw = _loss_then(rng, t0, np.full(N, 3.0), sigma)
    w = 9
    sm = robust.rolling_median(raw, w)
    best = int(np.argmin(sm[:t0]))
    level = float(sm[best]) + 0.1 * (3.0 - float(sm[best]))
    assert eng.departure(raw, sm, best, level, w) == t0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("t0", (N // 3, N // 2))
def test_a_departure_by_a_ramp_is_dated_where_it_cleared_a_tenth_of_the_rise(
        t0: int, seed: int) -> None:
    """A loss that rises linearly x4 over 100 steps: dated where it has risen a tenth of the
    way (within the noise's reach: 5% of the run), never before the ramp."""
    from tracealyze.analyzer.stats import robust

    rng = np.random.default_rng(10 + seed)
    ramp = 1.0 + 3.0 * np.clip(np.arange(N) / 100, 0, 1)
    raw = _loss_then(rng, t0, ramp, 0.03)
    w = 9
    sm = robust.rolling_median(raw, w)
    best = int(np.argmin(sm[:t0 + 1]))
    level = float(sm[best]) + 0.1 * (4.0 - float(sm[best]))
    got = eng.departure(raw, sm, best, level, w)
    assert t0 <= got <= t0 + 10 + TOL, (t0, got)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fall", (0, 10, 40))
def test_settle_dates_a_plateau_where_its_descent_ended(fall: int, seed: int) -> None:
    """A loss that falls for ``fall`` points, then sits at its level with noise: the plateau
    begins where the fall ended (within two points); one with no fall begins at once,
    whatever its noise."""
    rng = np.random.default_rng(20 + seed)
    y = np.full(200, 2.0) * np.exp(rng.normal(0, 0.01, 200))
    y[:fall] = 2.0 * (1 + np.linspace(1.0, 0.1, fall))
    got = eng.settle(y, 0, 0.05)
    assert abs(got - fall) <= 2, (fall, got)
