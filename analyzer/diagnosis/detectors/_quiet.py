"""A leak read where no new input shape came (memory_leak under per-shape caches, #45).

Between two steps that met a new input shape, a per-shape cache holds and a leak grows at
its own rate. What a memory sample reads besides the floor (the step's live batch, the
allocator's slack) is noise of its own at each sample, often far larger than a step's share
of either growth: ±0.35 MiB on a TCN whose clips have another length at every step. Over a
run of consecutive intervals free of new shapes that noise telescopes — the run changes by
its rate × its length plus the difference of its two end samples' noise — so the runs are
independent readings of the rate, whatever the noise (:func:`quiet_runs`). Imputing the
intervals with a new shape instead (``_workset.without_shapes``) turns that noise into a
random walk (√intervals × the noise: +3 MiB on the TCN, read as "9.9 KiB per step"), which
is fine for the trend test's yes/no when its own evidence is checked here, not for a rate's
significance or its onset.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

SHOWN_Z = 3.0
"""Standard errors by which the rate over the intervals free of new shapes must stand above
zero for a leak to be left (one-sided: a healthy cache is read as a leak 0.1% of the time).
The standard error is σ·√runs / steps, σ the robust spread of one interval's change (the
noise of two samples), steps the runs' total length."""
ONE_OFF_Z = 8.0
"""An interval whose change stands this many robust sigmas from the intervals' median change
is a one-off (a buffer allocated or freed), not the leak's rate: quiet_onset gives the
samples after it a level of their own. Why 8: beyond the tail of any noise the intervals'
spread measures (1e-15 for a normal), while the one-offs that moved a held-out run's onset
(a set transformer's temporary buffer, +1.2 MiB then freed, and the allocator's +0.83 MiB
steps, against σ = 30 KiB) stood 25-37 sigmas out."""
MIN_SAMPLES = 20
"""Samples inside runs needed to date a leak by them: fewer, and the change point is the
noise's."""


class Runs(NamedTuple):
    """Runs of consecutive memory intervals free of new input shapes."""
    begin: np.ndarray  # the step of each run's first sample
    end: np.ndarray  # ... and of its last
    delta: np.ndarray  # the memory's change over the run
    sigma: float  # robust spread of one interval's change (two samples' noise)
    step: np.ndarray  # the samples inside runs: their steps,
    val: np.ndarray  # ... values
    group: np.ndarray  # ... and run (0, 1, ...)
    part: np.ndarray  # ... and piece of a run between one-off changes (quiet_onset's levels)


def quiet_runs(s: np.ndarray, v: np.ndarray, shapes: tuple[np.ndarray, np.ndarray]) -> Runs:
    """The runs of the memory series (steps ``s``, values ``v``) between new input shapes
    (``shapes``: steps and new shapes per step; an interval holds a new shape met at either
    of its samples' steps or between them, as ``_workset.without_shapes`` counts it)."""
    met = np.sort(shapes[0][np.isfinite(shapes[1]) & (shapes[1] > 0)])
    near = np.searchsorted(met, s[1:], side="right") > np.searchsorted(met, s[:-1], side="left")
    idx = np.flatnonzero(~near & np.isfinite(v[1:]) & np.isfinite(v[:-1]))
    if not len(idx):
        empty = np.zeros(0)
        none = np.zeros(0, np.int64)
        return Runs(empty, empty, empty, 0.0, empty, empty, none, none)
    cut = np.flatnonzero(np.diff(idx) > 1) + 1
    first = idx[np.concatenate([[0], cut])]
    last = idx[np.concatenate([cut - 1, [len(idx) - 1]])] + 1
    dv = v[idx + 1] - v[idx]
    sigma = 1.4826 * float(np.median(np.abs(dv - np.median(dv))))
    inside = np.concatenate([np.arange(a, b + 1) for a, b in zip(first, last, strict=True)])
    group = np.repeat(np.arange(len(first)), last - first + 1)
    # a one-off change inside a run (a temporary buffer allocated, then freed: +2.5 MiB and
    # -1.8 MiB over three quiet steps of a 70 KiB-a-step leak) starts a new piece: its
    # level is its own, not a rate the hinge must fit
    odd = np.zeros(len(v), dtype=bool)
    odd[idx + 1] = np.abs(dv - np.median(dv)) > ONE_OFF_Z * max(sigma, 1e-12)
    part = np.cumsum(np.concatenate([[True], np.diff(group) > 0]) | odd[inside]) - 1
    return Runs(s[first].astype(np.float64), s[last].astype(np.float64),
                (v[last] - v[first]).astype(np.float64), sigma,
                s[inside].astype(np.float64), v[inside].astype(np.float64), group, part)


def quiet_rate(runs: Runs, start: float, until: float = np.inf) -> tuple[float, float]:
    """(rate per step, its standard error) over the runs from step ``start`` on, ending by
    ``until`` (a run across ``start`` counts from there, in proportion); (0, inf) without
    any."""
    b = np.maximum(runs.begin, start)
    keep = (runs.end > b) & (runs.end <= until)
    steps = float(np.sum(runs.end[keep] - b[keep]))
    if steps <= 0:
        return 0.0, float("inf")
    part = (runs.end[keep] - b[keep]) / (runs.end[keep] - runs.begin[keep])
    rate = float(np.sum(runs.delta[keep] * part)) / steps
    return rate, runs.sigma * float(np.sqrt(keep.sum())) / steps


def quiet_onset(runs: Runs, lo: int, hi: int) -> int | None:
    """The step from which the runs rise: flat before it, one rate after it, each run (each
    piece between one-off changes: ONE_OFF_Z) at a level of its own (a per-shape cache moves
    the level between runs) — the least-squares
    hinge over the samples inside runs from step ``lo`` on, searched over their steps up to
    ``hi``. Sample by
    sample, so that an onset inside a long run (the shapes all seen) is found in it. None
    with fewer than MIN_SAMPLES samples inside runs, or no rising fit."""
    keep = runs.step >= lo  # (what came before lo is another regime: a cache's fill)
    t, y = runs.step[keep], runs.val[keep]
    g = np.unique(runs.part[keep], return_inverse=True)[1]
    if len(t) < MIN_SAMPLES:
        return None
    n = np.bincount(g).astype(np.float64)
    yc = y - (np.bincount(g, y) / n)[g]
    best, at = 0.0, None
    for tau in np.unique(t[(t >= lo) & (t <= hi)]):
        h = np.maximum(t - tau, 0.0)
        hc = h - (np.bincount(g, h) / n)[g]
        hh, hy = float(hc @ hc), float(hc @ yc)
        if hh > 0 and hy > 0 and hy * hy / hh > best:  # (rising; the largest SSE cut)
            best, at = hy * hy / hh, int(tau)
    return at
