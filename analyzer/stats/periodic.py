"""Structure by design: a deviation that recurs at the same phase of a fixed period.

Training loops have periods of their own: a multi-task loop trains task B every 4th step, a
curriculum switches sources every N steps, an evaluation or checkpoint runs every N steps,
gradient accumulation steps the optimizer every k micro-batches. Each shows as a series
whose deviation from its local level recurs at one phase of a period, cycle after cycle.
An accident (a bad batch, an instability) does not keep an appointment: so a deviation is
structure when the *median* over the cycles at its phase is itself a deviation — more than
half the cycles show it there — over at least ``MIN_CYCLES`` cycles.

:func:`phase_pattern` finds the smallest such period (a pattern of period 4 also repeats at 8,
12, ...: the smallest is the loop's own), and which phases deviate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_CYCLES = 4
"""Cycles a phase must have been seen in before its median says anything (with 3, two
accidents at the same phase by chance would pass)."""
MAX_PERIOD = 128
"""Longest period looked for: eval/checkpoint cadences in step counts of a short run."""
MAX_POINTS = 20_000
"""Steps looked at (the latest): 127 periods × a sort of 20k values stays well under 1 s."""


@dataclass(frozen=True)
class Pattern:
    period: int
    phases: tuple[int, ...]
    """The phases (step mod period) whose median deviates."""
    cycles: int
    """Full cycles the run covers."""

    def explains(self, step: int) -> bool:
        return step % self.period in self.phases

    def text(self) -> str:
        at = ", ".join(str(p) for p in self.phases[:4])
        return (f"every {self.period} steps (step mod {self.period} = {at}), in "
                f"{self.cycles} cycles")


SAME_SIZE = 10.0
"""A design repeats at a similar size: the quartiles of a phase's deviations lie within this
factor (a multi-task head's loss is ~10x the other's every time; a divergence's deviations
grow by orders of magnitude)."""


def _same_size(dev: np.ndarray) -> bool:
    q1, q3 = np.quantile(dev, [0.25, 0.75])
    return bool(q1 > 0 and q3 / q1 <= SAME_SIZE)


def _latest_finite(step: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The latest MAX_POINTS steps (bounded work), where ``x`` is known."""
    step = np.asarray(step, dtype=np.int64)[-MAX_POINTS:]
    x = np.asarray(x, dtype=np.float64)[-MAX_POINTS:]
    ok = np.isfinite(x)
    return step[ok], x[ok]


def _by_phase(step: np.ndarray, x: np.ndarray, period: int
              ) -> tuple[np.ndarray, list[np.ndarray]]:
    """(the phases seen, in order; the values of ``x`` at each) for ``step % period``."""
    phase = step % period
    order = np.argsort(phase, kind="stable")
    ph, xx = phase[order], x[order]
    cuts = np.flatnonzero(np.diff(ph)) + 1
    return (ph[np.r_[0, cuts]] if len(ph) else ph), np.split(xx, cuts)


def phase_pattern(step: np.ndarray, z: np.ndarray, threshold: float,
                  min_cycles: int = MIN_CYCLES, max_period: int = MAX_PERIOD
                  ) -> Pattern | None:
    """The smallest period P ≥ 2 at which, at some phase, ``z`` (a deviation in units of its
    usual noise, NaN where unknown) is above ``threshold`` in more than half the cycles
    (its median is a deviation; an even split is not a majority), each such phase seen
    in ≥ ``min_cycles`` cycles, no more than half the phases deviate (a pattern that covers
    most steps is a level, not an appointment), and the other phases are calm (median |z| ≤
    threshold / 2), and its deviations are of a similar size cycle after cycle (quartiles
    within ``SAME_SIZE``). None when there is none."""
    step, z = _latest_finite(step, z)
    if len(step) < 2 * min_cycles:
        return None
    span = int(step[-1] - step[0]) + 1
    for period in range(2, min(max_period, span // min_cycles) + 1):
        keys, groups = _by_phase(step, z, period)
        high = [int(k) for k, g in zip(keys, groups, strict=True)
                if len(g) >= min_cycles and 2 * int(np.sum(g > threshold)) > len(g)
                and _same_size(g[g > threshold])]
        # the rest of the cycle must be calm (a median deviation under half the threshold):
        # a series that swings at every phase (an oscillating divergence) has no appointment
        calm = all(float(np.median(np.abs(g))) <= threshold / 2
                   for k, g in zip(keys, groups, strict=True) if int(k) not in high)
        if high and len(high) * 2 <= period and calm:
            return Pattern(period, tuple(high), span // period)
    return None


LEVEL_Z = 6.0
"""Standard errors a phase's median must stand above the others' (the median of n points has
a standard error of 1.2533·σ/√n). Up to ~8,000 (period, phase) pairs are looked at: in 40
generated series of heavy-tailed noise (Student-t, 3 degrees of freedom) the largest was
4.0 standard errors at the median and 5.4 at most; a multi-task loop's phase stands ≥ 10 above."""
LEVEL_CYCLES = 8
"""Cycles a phase needs for :func:`phase_level`, whose deviations may each be small: with 8
the median's standard error is 0.44σ, so the 1σ floor is itself 2.3 standard errors and the
three-in-four test counts at least 6 cycles (with phase_pattern's 4, two chance deviations
at one phase would pass)."""


def _phase_medians(step: np.ndarray, dev: np.ndarray, sigma: float, period: int,
                   min_cycles: int) -> tuple[list[int], bool]:
    """(the phases whose median stands out, whether the others are calm) at ``period``."""
    keys, groups = _by_phase(step, dev, period)
    ns = np.array([len(g) for g in groups])
    # (against the other phases' common level, the median of all but the highest phase:
    # a rolling baseline sits a little above the calm phases when a quarter of the points
    # are higher, and between the two when a task comes every 2nd step)
    meds = np.array([np.median(g) for g in groups])
    c = float(np.median(np.sort(meds)[:-1]))
    q1 = np.array([np.quantile(g, 0.25) for g in groups]) - c
    meds = meds - c
    bar = np.maximum(LEVEL_Z * 1.2533 * sigma / np.sqrt(ns), sigma)
    high = [int(k) for k, m, b, n, q in zip(keys, meds, bar, ns, q1, strict=True)
            if n >= min_cycles and m > b and q > 0]
    calm = all(abs(m) <= b / 2 for k, m, b in zip(keys, meds, bar, strict=True)
               if int(k) not in high)
    return high, calm


def phase_level(step: np.ndarray, dev: np.ndarray, sigma: float,
                min_cycles: int = LEVEL_CYCLES, max_period: int = MAX_PERIOD
                ) -> Pattern | None:
    """Structure whose single deviations are too small to be spikes: a multi-task loop whose
    second loss is 3× the first while the per-batch noise is ±70% (a CNN's). ``dev`` is a
    deviation from the local level (the log loss minus its rolling median: a loss ×3 is the
    same deviation at any level) and ``sigma`` its per-point noise. A phase is structure when
    its median over the cycles stands above the other phases' by LEVEL_Z standard errors and
    by at least σ, three cycles in four are above that common level (a design keeps its
    appointment almost every time), and the other phases are calm. The period is the
    smallest such, refined to a multiple whose standing-out phases are fewer (a task on
    every 4th step shows at period 2 as half of phase 1)."""
    step, dev = _latest_finite(step, dev)
    if len(step) < 2 * min_cycles or not sigma > 0:
        return None
    span = int(step[-1] - step[0]) + 1
    top = min(max_period, span // min_cycles)
    for period in range(2, top + 1):
        high, calm = _phase_medians(step, dev, sigma, period, min_cycles)
        if not (high and len(high) * 2 <= period and calm):
            continue
        k = 2
        while k * period <= top:
            h2, c2 = _phase_medians(step, dev, sigma, k * period, min_cycles)
            if h2 and c2 and len(h2) < k * len(high) and len(h2) * 2 <= k * period:
                period, high, k = k * period, h2, 2
            else:
                k += 1
        return Pattern(period, tuple(high), span // period)
    return None


ONE_PHASE_CHANCE = 1e-3
"""Largest chance, P^-(k-1), that k events at random steps all fall on one phase of a period P
for :func:`one_phase` to call them an appointment (8 spikes on one phase of 3: 5e-4; 4 random
spikes on one parity: 0.125, which is chance)."""


def one_phase(steps: np.ndarray, max_period: int = MAX_PERIOD) -> Pattern | None:
    """Events (spike steps) that all fall on one phase of a period P: a round-robin loop's task
    whose loss is far above the others' until it learns, then not (its phase's median over
    the whole run is no deviation, so :func:`phase_pattern` cannot see it). The appointment:
    at least MIN_CYCLES events, all on one phase of the smallest such P that chance would
    not explain (P^-(k-1) ≤ ONE_PHASE_CHANCE), and kept: more than half of that phase's
    steps from the first event to the last are events. None otherwise."""
    steps = np.unique(np.asarray(steps, dtype=np.int64))
    k = len(steps)
    if k < MIN_CYCLES:
        return None
    span = int(steps[-1] - steps[0])
    for period in range(2, min(max_period, span) + 1):
        if len(np.unique(steps % period)) != 1:
            continue
        if float(period) ** (1 - k) > ONE_PHASE_CHANCE:
            continue
        cycles = span // period + 1
        if 2 * k > cycles:
            return Pattern(period, (int(steps[0] % period),), cycles)
    return None
