"""step_time_outlier's second question (#45): did the run slow down for good?

A loop that starts doing extra work every step (validation run by a misplaced condition, a
debugging hook left on, a per-step sync) makes no step an outlier: every step from then on is
slower. What shows it is the time per unit of work. Where the recorder has each step's token
count, a level shift of seconds per token that lasts to the end of the run is a slowdown;
where it has none, a curriculum that doubles the sequence length is the same picture as a
bug, and nothing is said.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...stats.hostwait import MACHINE_SHARE
from .. import anchors
from ..findings import Finding

SLOWER = 2.0
"""A slowdown is at least this factor in seconds per token: the outlier rule's own bar for a
step far slower than the typical one ((1 + min_rel) x the median), applied to a level. The
held-out runs' healthy curricula and bucketed batches keep their time per token within
1.6x; validation run every step made it 2.7x."""
MIN_SEGMENT = 0.05
"""Each side of the shift holds at least this share of the judged steps (and 10): a level,
not a few slow steps at the end."""
GRID = 200
"""Candidate split points scanned before the exact one is refined (bounded work on runs of
100k steps)."""


def _gain(x: np.ndarray, t: int) -> float:
    return float(np.median(x[t:]) - np.median(x[:t]))


def slowdown(step: np.ndarray, dur: np.ndarray, tps: np.ndarray, queue: np.ndarray,
             cpu: np.ndarray, judged: np.ndarray) -> dict[str, Any] | None:
    """The lasting rise of seconds per token over the judged steps, or None: its index in
    the judged steps, factor, tokens/s before and after, and whether the machine's other
    processes explain it (the training thread waited for a CPU through the extra time)."""
    work = tps * dur
    ok = judged & np.isfinite(work) & (work > 0) & np.isfinite(dur) & (dur > 0)
    if ok.sum() < 0.8 * max(int(judged.sum()), 1):
        return None  # no work figures: a curriculum and a slowdown look alike
    s, d, w = step[ok], dur[ok], work[ok]
    x = np.log(d / w)
    n = len(x)
    m = max(10, math.ceil(MIN_SEGMENT * n))
    if n < 2 * m:
        return None
    grid = np.unique(np.linspace(m, n - m, min(GRID, n - 2 * m + 1)).astype(int))
    gains = np.array([_gain(x, int(t)) for t in grid])
    best = int(grid[int(np.argmax(gains))])
    span = int(np.max(np.diff(grid))) if len(grid) > 1 else 1
    near = range(max(m, best - span), min(n - m, best + span) + 1)
    t = max(near, key=lambda k: (_gain(x, k), -k))
    level = float(np.median(x[:t]))
    if _gain(x, t) < math.log(SLOWER) or float(np.median(x[-m:])) - level < math.log(SLOWER):
        return None  # (not that much slower, or not to the end: a spell, not a slowdown)
    # the exact onset: the median split trades a few transition steps between the sides;
    # the shift starts at the first of the run of steps above the midpoint of the levels
    mid = (level + float(np.median(x[t:]))) / 2
    while t < n - m and x[t] < mid:
        t += 1
    while t > m and x[t - 1] > mid:
        t -= 1
    before, after = slice(0, t), slice(t, n)
    machine = False
    q, c = queue[ok], cpu[ok]
    if np.isfinite(q).all():
        usual = float(np.median(q[before] / d[before]))
        excess = d[after] - np.exp(level) * w[after]
        beyond = q[after] - usual * d[after]
        machine = float(np.median(beyond)) >= MACHINE_SHARE * float(np.median(excess))
    cpu_share = None
    if np.isfinite(c).all():
        extra = c[after] - np.exp(np.median(np.log(c[before] / w[before]))) * w[after]
        cpu_share = float(np.median(extra) / max(float(np.median(
            d[after] - np.exp(level) * w[after])), 1e-12))
    return {"index": t, "step": int(s[t]), "factor": float(math.exp(_gain(x, t))),
            "tps_before": float(np.median(w[before] / d[before])),
            "tps_after": float(np.median(w[after] / d[after])),
            "machine": machine, "cpu_share": cpu_share, "steps": int(n - t)}


def finding(detector: str, rank: int, sd: dict[str, Any]) -> Finding:
    """The finding for a lasting slowdown (warning; info when other processes took the
    CPUs)."""
    own = not sd["machine"]
    what = ("" if sd["cpu_share"] is None else
            " The process's CPU time per token rose with it: its own extra work each step."
            if sd["cpu_share"] >= 0.5 else
            " The process did not work more on the CPU: it waits longer each step (a "
            "device sync, I/O, a lock).")
    return Finding(
        id=detector, severity="warning" if own else "info", subject=f"rank {rank}",
        first_step=sd["step"],
        title=f"Training slowed {sd['factor']:.1f}x from step {sd['step']} and stayed slow",
        message=(f"From step {sd['step']} on rank {rank}, each step takes "
                 f"{sd['factor']:.1f}x as long per token as before "
                 f"({sd['tps_before']:,.0f} -> {sd['tps_after']:,.0f} tokens/s), to the end "
                 f"of the run ({sd['steps']} steps)."
                 + (what if own else " Other processes held the CPUs meanwhile (the "
                    "training thread waited for a CPU through the extra time): likely not "
                    "the training's own slowdown.")),
        advice="Look at what changed at that step: an evaluation or metric computed every "
               "step, a hook or anomaly mode switched on, a .item()/sync added, memory "
               "pressure (swapping, a growing cache), thermal throttling or a co-located job.",
        chart=anchors.STEP_TIME,
        evidence={"slowdown_factor": sd["factor"], "tokens_per_s_before": sd["tps_before"],
                  "tokens_per_s_after": sd["tps_after"], "rank": rank,
                  "machine": sd["machine"], "slowdown": True})
