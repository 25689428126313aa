"""The onset engine (issue 45): where a step series changes regime, in one tested place.

The detectors that date a change of regime take its onset from here or from the two
structure modules beside it (gradient_explosion: :func:`hinge`, :func:`single_jump`;
memory_leak and cuda_oom: :func:`regime_start`, :func:`steady_onset`, :func:`into_warmup`,
``fill.filling``;
loss_spike: ``periodic``; the step data every loss detector reads: ``shift``), so one
principle dates them: an onset is the first step of the new regime, found on the series
itself, never a threshold crossing some steps later. (loss_divergence dates its rise and
vanishing_gradient its fall with :func:`departure`, loss_plateau its start with
:func:`settle`.)

The kinds of change, each with its primitive:

* **jump** (:func:`single_jump`, :func:`jump_onset`): one step takes the series out of its
  baseline's range for good. Dated to that step exactly (a batch that threw the run).
* **growth** (:func:`hinge`, :func:`growth_onset`): a flat level turns into a straight rise.
  On a log series that is geometric growth (an exploding gradient norm); dated where the
  growth rate changed, step 0 when there is no calm prefix.
* **drift** (:func:`regime_start`, :func:`steady_onset`, :func:`into_warmup`,
  :func:`along_line`; ``fill.filling``, ``fill.new_keys``): a counter starts rising
  steadily (a leak's malloc'd bytes): the rise that runs to the end, found walking back at
  its own rate; a rise whose rate keeps falling, or that comes as a cache's ever rarer new
  keys, is a cache filling, not a drift.
* **departure** (:func:`departure`): a series leaves its best level for good (a loss that
  diverges after its best point); **settle** (:func:`settle`): a descent ends in a plateau.
* **level shift** and **periodic pattern**: ``shift.objective_shift`` (every gradient and the
  loss rescaled at one step) and ``periodic.phase_pattern``/``phase_level`` (a loop's
  structure by design, and a level that moved under it).

:func:`onsets` runs the first three on one series: what a detector, the report or a user
reads as "where did this change". Property tests on generated series with known onsets (at
step 0, mid-run and in the last 5%, at the noise of real runs) live in
tests/analyzer/test_onset_engine.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import robust as _stats
from .fill import filling


@dataclass(frozen=True)
class Onset:
    """One change of regime in a step series."""

    kind: str
    """``jump``, ``growth`` or ``drift``."""
    index: int
    """Position in the series of the new regime's first point."""
    step: int
    """The training step of that point."""


def trailing_run(mask: np.ndarray) -> int:
    """Where the unbroken run of True that reaches the end of ``mask`` begins (``len(mask)``
    when its last element is False): a state held from a point to the end of the run."""
    off = np.flatnonzero(~np.asarray(mask, dtype=bool))
    return int(off[-1]) + 1 if len(off) else 0


def single_jump(x: np.ndarray, j: int, i: int, need: float, w: int, end: int) -> int:
    """The onset of a rise found at x[j..i] (sustained to ``end``) when one step makes it: a
    batch that threw the run is dated to its own step, not to the smoothed series' bend or
    a noise blip a few steps before it.

    The step that takes the series out of its baseline for good (every point from it to
    ``end`` above the range of the ``w`` points before the onset) must itself rise by the
    factor, from a point still inside that range; or, once out of it, the largest one-step
    rise by the factor from a point within half the factor of the range, at the step that
    leaves it or the next (a noise blip just over the range the step before the jump: 0.38
    -> 1.07 -> 5.5e7). A growth, however fast
    (3.5, 5.5, 12, 273, 5e3 from step 0), has left the range of its first points before its
    largest step, and keeps its onset; a noisy bias gradient (0.002 to 0.3 from step to
    step) stays inside its range until the jump."""
    base = x[max(0, j - w):j + 1]
    top = float(np.max(base))
    # (out of the range is enough: a batch that throws a growth off starts it there, though
    # the growth may take a few steps to clear half the factor; the one-step rise by the
    # factor from at most half of it above the range is what no growth's own step does)
    above = x[j:end] > top
    below = np.flatnonzero(~above)
    e = j + (int(below[-1]) + 1 if len(below) else 0)
    if not j < e < end:
        return j
    # the jump leaves the range at once, or right after one blip: a series that has been out
    # of its range for steps (a warm-up to a 10x LR: x3.7, x1.5, x10 over eight steps) is
    # growing already, and its largest step is one step of that growth
    ks = np.arange(e, min(end, e + 2))
    rise = np.where(x[ks - 1] <= top + need / 2, x[ks] - x[ks - 1], -np.inf)
    k = int(ks[int(np.argmax(rise))])
    return k if x[k] - x[k - 1] >= need and x[k - 1] <= top + need / 2 else j


def hinge(x: np.ndarray, a: int, b: int, default: int) -> int:
    """The index τ in [a, b) that best splits x[a:b+1] into a flat level followed by a
    straight rise (least squares of y = c + k·max(0, t − τ), k > 0); ``default`` when no
    split fits a rise."""
    y = x[a:b + 1]
    n = len(y)
    if n < 4 or not np.isfinite(y).all():
        return default
    t = np.arange(n, dtype=np.float64)
    taus = np.arange(0, n - 2)
    h = np.maximum(0.0, t[None, :] - taus[:, None])  # [τ, t]
    hm = h - h.mean(axis=1, keepdims=True)
    ym = y - y.mean()
    var = (hm * hm).sum(axis=1)
    k = np.where(var > 0, (hm * ym).sum(axis=1) / np.where(var > 0, var, 1.0), 0.0)
    sse = ((ym[None, :] - k[:, None] * hm) ** 2).sum(axis=1)
    sse = np.where(k > 0, sse, np.inf)
    if not np.isfinite(sse).any():
        return default
    return a + int(taus[int(np.argmin(sse))])



def steady_onset(step: np.ndarray, val: np.ndarray, slope: float, window: int = 5
                 ) -> int | None:
    """The step where a steady per-step rise begins: from there on, every ``window``
    consecutive steps have at least half their increments above slope/2 (a counter that
    grows by about ``slope`` every step, as malloc'd bytes do under a tensor leak). None
    when the rise is not steady at that resolution (RSS grows in allocator-sized jumps):
    the window-floor estimate stands then. Isolated jumps before the leak (a flush's
    buffers) are single increments and do not start it. A pause once the counter has left
    its starting level (a few slow steps whose samples repeat, an allocator trim) is an
    interruption of the leak, not a new start: only pauses at the starting level (within
    a tenth of the whole rise), and not right after a run of rising steps, can come before
    the leak."""
    if slope <= 0 or len(val) < 3 * window:
        return None
    d = np.diff(val) * (1.0 / np.maximum(np.diff(step), 1))
    rising = (d > slope / 2).astype(np.float64)
    frac = np.convolve(rising, np.ones(window) / window, mode="valid")  # forward windows
    base = float(np.median(val[:window]))
    near = val[:len(frac)] <= base + 0.1 * max(float(val[-1]) - base, 0.0)
    # (and rose by less than half the rate over the window as a whole: a leak whose size
    # varies step to step, as dynamic shapes make it, has windows with few large steps)
    rise = np.convolve(d, np.ones(window), mode="valid")
    # (and the leak was not already running: a pause right after `window` mostly rising
    # steps is one, e.g. the recorder's own flush, a transient allocation and its release,
    # a few steps after the leak began)
    before = np.r_[np.zeros(window), frac][:len(frac)]
    low = np.flatnonzero((frac < 0.5) & (rise < slope * window / 2) & near & (before < 0.5))
    i = int(low[-1]) + 1 if len(low) else 0
    if i >= len(frac) - window:
        return None
    # the first rising increment at or after i is the leak's first effect: it started at
    # the step before it
    # (a transient allocation, e.g. a flush's buffer freed right after, rises and falls
    # back at once: not the leak's start)
    nxt = np.r_[d[1:], 0.0]
    up = np.flatnonzero((rising[i:] > 0) & (nxt[i:] > -d[i:] / 2))
    return int(step[i + int(up[0])]) if len(up) else None


def into_warmup(step: np.ndarray, val: np.ndarray, first: int, slope: float) -> int:
    """A leak dated at the first step the statistics look at may have begun in the warm-up
    they skip (allocator and caches settling are excluded from the test, not from the
    leak's history): walk back from ``first`` while every step still rose by more than half
    the leak's rate, as the leak's own steps do. A warm-up that settled (flat steps before
    the leak) stops the walk at once."""
    i = int(np.searchsorted(step, first))
    if i >= len(step) or step[i] != first:
        return first
    while i > 0:
        gap = max(float(step[i] - step[i - 1]), 1.0)
        if (float(val[i]) - float(val[i - 1])) / gap <= slope / 2:
            break
        i -= 1
    return int(step[i])



def along_line(step: np.ndarray, val: np.ndarray, first: int, slope: float) -> int:
    """A drift dated at ``first`` that ran already before it, in steps of any pattern (a
    leak every N steps climbs in stairs, not step by step): walk back from ``first`` while
    the values stay on the drift's own line (Theil–Sen over the drift, from ``first`` on)
    within the band its own values keep around that line (1st to 99th percentile of the
    residuals, widened by a quarter). A warm-up that allocated far faster, or a flat level
    the drift left, leaves the band at once. ``slope`` > 0 says there is a drift."""
    i = int(np.searchsorted(step, first))
    if i >= len(step) or step[i] != first or slope <= 0 or len(step) - i < 8:
        return first
    xs = step.astype(np.float64)
    k, c = _stats.theil_sen(xs[i:], val[i:])
    if k <= 0:
        return first
    resid = val - (c + k * xs)
    lo, hi = np.percentile(resid[i:], [1, 99])
    pad = 0.25 * float(hi - lo)
    while i > 0 and lo - pad <= float(resid[i - 1]) <= hi + pad:
        i -= 1
    return int(step[i])


def regime_start(x: np.ndarray, y: np.ndarray) -> int | None:
    """The index of the last floor before the rise that runs to the end: with the level's
    one-off steps taken out (a lone window-to-window rise of over three windows of the final
    third's rate; lone rises that recur to the end are the leak's own, periodic steps, and set
    the stretch its rate is read over), walk back from the end while the floors' slope over a
    tenth of the windows stays within a factor 2 of the final third's rate (the leak's own
    regime: a warm-up that filled faster, or a level it rose from, is not), then the engine's
    flat-then-rising fit (hinge) places it from just before where the walk stopped. None when
    the last third does not rise."""
    n = len(y)
    m = max(2, n // 10)
    if n < 3 * m:
        return None
    k = float(_stats.theil_sen(x[-(n // 3):], y[-(n // 3):])[0])
    if k <= 0:
        return None
    # one-off steps in the level (an allocation made once, a buffer kept after a write): a
    # window-to-window rise of more than three windows of the final rate, between two that
    # are not, is taken out of the floors before the regime is looked for, so a level lifted
    # once, before the leak or inside it, is neither its start nor a faster rate. (A leak
    # that steps every few windows rises by less than that at each of its steps; a warm-up
    # that fills faster does so window after window, and stays.)
    dy = np.diff(y)
    dx = np.maximum(np.diff(x), 1.0)
    big = dy > 3 * k * dx
    alone = big & ~np.r_[False, big[:-1]] & ~np.r_[big[1:], False]
    stairs = np.flatnonzero(alone)
    if len(stairs) >= 3 and stairs[-1] >= n - 1 - n // 3:
        # Lone rises that recur to the end are the leak's own steps, not one-offs: memory
        # kept at a period longer than three windows (a copy of the weights every 50 steps)
        # rises only there. The regime's rate is then read over a stretch that spans its
        # longest gap, where the flat between two steps is not a change of regime; a lone
        # rise over three times the steps' median size is still a one-off.
        size = float(np.median(dy[stairs]))
        stairs = stairs[dy[stairs] <= 3 * size]
        gaps = np.diff(stairs)
        g = float(np.median(gaps)) if len(gaps) else 0.0
        regular = gaps[np.abs(gaps - g) <= max(1.0, 0.25 * g)]
        # periodic (two gaps in three at one period, within a quarter of it): a cache's
        # rare new keys arrive at irregular steps and are not a regime's steps
        if len(gaps) >= 2 and 3 * len(regular) >= 2 * len(gaps):
            alone &= dy > 3 * size
            m = max(m, int(regular.max()) + 1)
            if n < 2 * m:
                return 0
    lift = np.where(alone, dy - k * dx, 0.0)
    y = y - np.concatenate([[0.0], np.cumsum(lift)])

    def local(i: int) -> float:
        j = min(i + m, n - 1)
        return float(y[j] - y[i]) / max(float(x[j] - x[i]), 1.0)

    i = n - 1 - m
    while i > 0 and k / 2 <= local(i - 1) <= 2 * k:
        i -= 1
    if i == 0:
        return 0
    return hinge(y, max(0, i - m), n - 1, i)


def departure(raw: np.ndarray, smooth: np.ndarray, best: int, level: float, w: int) -> int:
    """Where a series leaves its best (lowest) level for good: ``best`` is the index of that
    lowest point, ``smooth`` a rolling median of window ``w``, ``level`` the bar between the
    two regimes. The smoothed series last rises above ``level`` within half a window of the
    raw one; the departure is the split, within ``w`` points of that crossing, that best
    separates the raw points below the bar (before it) from those above (from it on), over
    the 2w points before the crossing and w after: a jump is dated to its own step, one noisy
    point above the bar a few steps before it does not move it (the first raw point over
    the bar would)."""
    after = smooth[best:]
    stays = np.flatnonzero(after <= level)
    from_i = int(stays[-1]) + 1 if len(stays) else 0
    # (a centred rolling median crosses up to half a window before the raw series does)
    up = raw[best:][:from_i + w + 1] > level
    lo = max(0, from_i - 2 * w)
    seg = up[lo:]
    cands = range(max(lo, from_i - w), len(up))
    # errors of the split at d: points above the bar before it, and below it from d on
    above_before = np.concatenate([[0], np.cumsum(seg)])
    below_from = np.concatenate([np.cumsum((~seg)[::-1])[::-1], [0]])
    errs = [int(above_before[d - lo]) + int(below_from[d - lo]) for d in cands]
    return best + cands[int(np.argmin(errs))]


def settle(y: np.ndarray, start: int, band_frac: float) -> int:
    """Where a descent into a plateau ends: from ``start`` (the first index of a tail that no
    longer falls), the index after the last point of the tail's first fifth that lies above
    the tail's level × (1 + ``band_frac``), when the points up to it lie above that band as
    a whole (their median; a few noisy points on a flat level do not move it). A fall in the
    first steps before a long flat stretch belongs to that tail, but the plateau begins
    where it ends."""
    band = float(np.median(y[start:])) * (1 + float(band_frac))
    above = np.flatnonzero(y[start:] > band)
    above = above[above < (len(y) - start) // 5]  # (the settling: later noise is noise)
    if len(above) and float(np.median(y[start:start + int(above[-1]) + 1])) > band:
        return start + int(above[-1]) + 1
    return start


def jump_onset(step: np.ndarray, x: np.ndarray, need: float, w: int = 50) -> Onset | None:
    """The first step that rises by ``need`` out of the range of the ``w`` points before it
    and keeps the series above that range for good (:func:`single_jump`'s test); None when
    no step does. ``x`` holds finite values (a log series for multiplicative jumps)."""
    n = len(x)
    for e in np.flatnonzero(np.diff(x) >= need) + 1:
        e = int(e)
        if single_jump(x, e - 1, e, need, w, n) == e:
            return Onset("jump", e, int(step[e]))
    return None


def growth_onset(step: np.ndarray, x: np.ndarray, min_rise: float) -> Onset | None:
    """Where a flat level turns into a straight rise of at least ``min_rise`` by the end of
    the series (:func:`hinge` over the whole series; index 0 when the rise has no calm prefix
    to leave); None when the series does not rise that much from its level before the
    onset."""
    n = len(x)
    if n < 4:
        return None
    tau = hinge(x, 0, n - 1, -1)
    if tau < 0:
        return None
    before = float(np.median(x[:tau + 1]))
    if float(np.median(x[-3:])) - before < min_rise:
        return None
    return Onset("growth", tau, int(step[tau]))


def drift_onset(step: np.ndarray, x: np.ndarray, fill_ratio: float = 0.3) -> Onset | None:
    """Where a counter starts rising steadily: :func:`steady_onset` at its robust rate
    (Theil–Sen over the second half, or over the last tenth for a drift that began there),
    confirmed by a significant monotone rise from the onset on (Mann–Kendall p < 0.001).
    None when it does not drift, or when its rise keeps slowing as a cache's filling does
    (:func:`filling` at ``fill_ratio``)."""
    n = len(x)
    if n < 30:
        return None
    xs = step.astype(np.float64)
    tail = max(10, n // 10)
    slope = max(_stats.theil_sen(xs[n // 2:], x[n // 2:])[0],
                _stats.theil_sen(xs[-tail:], x[-tail:])[0])
    if slope <= 0:
        return None
    if filling(_stats.bucket_series(xs, x, 50, how="min")[1], fill_ratio):
        return None
    at = steady_onset(step, x, float(slope))
    if at is None:
        return None
    i = int(np.searchsorted(step, at))
    z, p = _stats.mann_kendall(x[i:])
    if n - i < 8 or z <= 0 or p >= 1e-3:
        return None
    return Onset("drift", i, int(at))


def onsets(step: np.ndarray, x: np.ndarray, *, need: float = math.log(10),
           w: int = 50) -> list[Onset]:
    """Every kind of onset this engine finds in one series, in step order: a jump by
    ``need``, a growth rising ``need`` and a steady drift (``x`` as the primitives take it:
    a log series for norms, raw bytes for memory).

    A jump splits the series (binary segmentation at its sharpest change): the growth and
    drift are looked for in the regime after it, so a batch that threw the run does not
    pass for the start of a later growth."""
    jump = jump_onset(step, x, need, w)
    at = jump.index if jump is not None else 0
    found = [jump] if jump is not None else []
    for o in (growth_onset(step[at:], x[at:], need), drift_onset(step[at:], x[at:])):
        if o is not None and (jump is None or o.index > 0):
            found.append(Onset(o.kind, o.index + at, o.step))
    return sorted(found, key=lambda o: o.index)
