"""Is a counter's growth a cache filling rather than a drift (a leak)? A cache adds an entry
when a key is new, and keys seen are never new again, so its growth slows and comes at ever
rarer steps; a leak in a training loop keeps its rate, at every step or every N.
:func:`filling` reads the window floors' thirds, :func:`new_keys` the per-step rises (the
onset engine's drift primitives and memory_leak use both)."""

from __future__ import annotations

import numpy as np


def filling(y: np.ndarray, ratio: float) -> bool:
    """Does the series of window floors ``y`` grow at a falling rate: its growth over the
    last third under ``ratio`` × its growth over the first third, and no more than over the
    middle third? (A fill slows all along; a fill that stopped, then a leak, grows faster
    again at the end. Levels are medians of three floors, so one window's dip does not
    decide it.)"""
    n = len(y)
    if n < 9:
        return False

    def level(i: int) -> float:
        return float(np.median(y[max(0, i - 1):i + 2]))

    a, b = n // 3, 2 * n // 3
    first, mid, last = level(a) - level(1), level(b) - level(a), level(n - 2) - level(b)
    return first > 0 and last < ratio * first and mid >= last


SPORADIC_SHARE = 0.25
"""At most this share of a counter's later samples rise for its growth to be sporadic. A
leak of a tensor per step rises at every sample (1.0); one every N steps at 1/N of them, but
at equal gaps; oneDNN's per-expert kernels in the matrix's MoE under bf16 rose at 6-10%."""
GAP_CV = 0.25
"""Gaps between rises whose coefficient of variation exceeds this are irregular. A leak every
N steps keeps its cadence: gaps equal, CV 0 (under 0.2 with a sample of jitter in gaps of 5
or more); a cache's new keys arrive as a thinning random process, CV ~1, and three gaps of
one fall under 0.25 about one time in thirty."""
RARER = 0.5
"""A cache's new keys get rarer: the run's second half holds under this share of the rises
of its first half (a key seen is never new again); a leak's rises keep their rate (~1)."""


def new_keys(val: np.ndarray, floor: float) -> bool:
    """Does the counter ``val`` (one sample per recorded step) grow as a cache takes new keys
    (a per-shape kernel cache, a memo): by rises at few, irregular samples, ever rarer?

    A rise exceeds ``floor`` and 5 robust sigmas of the noise (read on the falls). After the
    first third, the rises carry at least half the growth (not a drift under the noise),
    come at under SPORADIC_SHARE of the samples (a loop's leak rises every step) and at
    irregular gaps (GAP_CV: a leak every N steps keeps its cadence, and fewer than four rises
    show none); and the second half of the series holds under RARER × the first half's rises.
    The window floors' thirds cannot see this when the cache's keys have a long tail
    (oneDNN's kernels for a mixture of experts' per-expert token counts: a handful of new
    counts in each later third, the middle one by chance fewer than the last)."""
    d = np.diff(np.asarray(val, np.float64))
    d = d[np.isfinite(d)]
    if len(d) < 12:
        return False
    # the noise from the falls alone: symmetric noise falls as often as it rises, while a
    # leak's every-step rises would inflate a spread taken over all the changes
    falls = -d[d < 0]
    sigma = 1.4826 * float(np.median(falls)) if len(falls) >= 10 else 0.0
    rise = d > max(floor, 5.0 * sigma)
    later, up = d[len(d) // 3:], np.flatnonzero(rise[len(d) // 3:])
    if (len(up) > SPORADIC_SHARE * len(later)
            or float(later[up].sum()) < 0.5 * max(float(later.sum()), 0.0)):
        return False
    if len(up) >= 4:
        gaps = np.diff(up).astype(np.float64)
        if float(np.std(gaps) / np.mean(gaps)) <= GAP_CV:
            return False
    half = len(d) // 2
    return int(rise[half:].sum()) < RARER * int(rise[:half].sum())
