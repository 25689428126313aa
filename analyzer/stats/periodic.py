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
    step = np.asarray(step, dtype=np.int64)[-MAX_POINTS:]  # (the latest: bounded work)
    z = np.asarray(z, dtype=np.float64)[-MAX_POINTS:]
    ok = np.isfinite(z)
    step, z = step[ok], z[ok]
    if len(step) < 2 * min_cycles:
        return None
    span = int(step[-1] - step[0]) + 1
    for period in range(2, min(max_period, span // min_cycles) + 1):
        phase = step % period
        order = np.argsort(phase, kind="stable")
        ph, zz = phase[order], z[order]
        cuts = np.flatnonzero(np.diff(ph)) + 1
        groups = np.split(zz, cuts)
        keys = ph[np.r_[0, cuts]] if len(ph) else ph
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
