"""The recorder's own memory taken out of a memory series: each ``torch.profiler`` window it
opened keeps a level (the trace's buffers) until it writes the trace; memory_leak must not
read that level as the training's growth."""

from __future__ import annotations

import json

import numpy as np

from ...stats import robust as _stats
from .base import Context

SETTLE = 10
"""Steps after a profiler window before its memory is read as settled."""


def profiler_windows(ctx: Context) -> dict[int, list[tuple[int, int]]]:
    """rank -> (first, last) step of each profiler window the recorder opened (its
    ``profiler_window`` events; fields checked, the run is untrusted)."""
    out: dict[int, list[tuple[int, int]]] = {}
    for rank, text in ctx.rows("SELECT rank, details FROM events "
                               "WHERE kind = 'profiler_window'"):
        try:
            d = json.loads(text) if isinstance(text, str) else {}
        except ValueError:
            continue
        a, b = (d.get("first_step"), d.get("last_step")) if isinstance(d, dict) else (0, 0)
        if isinstance(a, int) and isinstance(b, int) and 0 <= a <= b:
            out.setdefault(int(rank), []).append((a, b))
    return out


def discount(step: np.ndarray, val: np.ndarray, windows: list[tuple[int, int]]
             ) -> tuple[np.ndarray, np.ndarray]:
    """The recorder's own memory taken out: each profiler window's steps (and SETTLE after)
    are dropped, and the level its profiler kept (the settled median after it minus the
    median before it and the training's own trend over the gap, when positive) is
    subtracted from every later value; when the recorder frees it later (the trace written:
    a step that falls by half that level at once and stays down), the steps up to then are
    dropped instead. What the profiler keeps is a one-off step in the floor, and it is the
    recorder's, not the training's."""
    val = val.astype(np.float64).copy()
    keep = np.ones(len(step), dtype=bool)
    for a, b in sorted(windows):
        ok = np.isfinite(val)
        pre_at = ok & (step >= a - SETTLE) & (step < a)
        post_at = ok & (step > b + SETTLE) & (step <= b + 2 * SETTLE)
        pre, post = val[pre_at], val[post_at]
        if len(pre) and len(post):
            # less what the training's own trend added over the gap (a leak running
            # through the window is not the profiler's): the least-squares slope on either
            # side (a cache filling in bursts, most steps adding nothing, has a median
            # change of 0 and its growth over the gap read as the profiler's), averaged,
            # times the distance between the two medians' steps
            sides = [float(np.polyfit(step[m].astype(np.float64), val[m], 1)[0])
                     for m in (pre_at, post_at) if m.sum() > 2]
            trend = float(np.mean(sides)) if sides else 0.0
            gap = float(np.median(step[post_at]) - np.median(step[pre_at]))
            kept = max(0.0, float(np.median(post)) - float(np.median(pre)) - trend * gap)
            # a level the profiler kept stands out of the steps' own changes (3 robust
            # sigmas of them on either side); a few KiB of noise is no level, and taking it
            # for one made any later fall of that size "the recorder freeing it"
            noise = _stats.mad_sigma(np.concatenate([np.diff(val[m]) for m in (pre_at, post_at)
                                                     if m.sum() > 1] or [np.zeros(0)]))
            kept = kept if kept > max(3 * noise, 1.0) else 0.0  # (under a byte: rounding)
            # until the recorder frees it (the trace written, tens of steps later): the
            # first later step whose value falls by half of it at once, and stays down
            after = np.flatnonzero(ok & (step > b + SETTLE))
            drops = after[1:][np.diff(val[after]) <= -kept / 2] if kept > 0 else after[:0]
            freed = next((i for i in drops if _stays_down(step, val, i, kept / 2)), None)
            if freed is not None:  # the steps that held it are skipped, nothing moved
                keep &= ~((step >= a) & (step < step[freed]))
            else:
                val[step > b] -= kept
        keep &= ~((step >= a) & (step <= b + SETTLE))
    return step[keep], val[keep]


def _stays_down(step: np.ndarray, val: np.ndarray, i: int, by: float) -> bool:
    """Does the series stay ``by`` lower after the fall at index ``i`` than the SETTLE steps
    before it, net of their own trend? The recorder's freed trace buffers are gone for good;
    a leaking heap's passing fall (a grown list moved to a larger block, a malloc trim) is
    overtaken within steps (a hook-per-step leak of 73 KiB a step fell 220 KiB once, 380
    steps after the window: taken for the free, it dropped the leak's first 380 steps)."""
    pre = np.arange(max(i - SETTLE, 0), i)
    post = np.arange(i, min(i + SETTLE, len(val)))
    pre, post = pre[np.isfinite(val[pre])], post[np.isfinite(val[post])]
    if len(pre) < 3:
        return True  # too near the window to tell: the fall as it is
    if i + SETTLE > len(val):
        # it cannot be seen to stay down for SETTLE steps: not shown to be the free (taken
        # for it, a fall 5 steps before the end dropped every step since the window: a
        # leak from step 200 of 420 left with 54 samples and read as no leak)
        return False
    xs = step.astype(np.float64)
    # the trend per step: the median step's (a one-off rise just before the fall, the grown
    # list's new block, would tilt a fitted line)
    trend = max(float(np.median(np.diff(val[pre]) / np.diff(xs[pre]))), 0.0)
    gap = float(np.median(xs[post]) - np.median(xs[pre]))
    return float(np.median(val[post]) - np.median(val[pre])) - trend * gap <= -by
