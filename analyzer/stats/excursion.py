"""Was a rise one step's doing, or the top of a climb? (loss_spike's single-step test, #45).

A spike is a batch: the step before it sits at the level (give or take its noise) and the
step itself carries the rise. An instability that grows and then corrects itself (a
full-batch run at the edge of stability: the loss x2.4 over 20 steps, each step ~10% above
the last, then back down) reaches the same height over many steps, none of which made much
of it; its highest points are no batch, and dating "the batch" there names a step that did
nothing (issue 45: "sharp events are dated at their step", and only sharp events are).
"""

from __future__ import annotations

import numpy as np

SHARE = 0.5
"""A rise is one step's doing when that step made at least this share of its height above
the level. Why a half: a batch makes all of its rise in one step (the step before it at the
level, give or take its noise), and a batch whose knocked model climbs once more on the
next step (level 1, then 5, then 9) still makes half at the top; a climb of three or more
comparable steps (1, 4, 7, 10) never does, nor a geometric one slower than doubling each
step (its last step makes (q-1)/q of the height)."""


def single_step(x: np.ndarray, level: np.ndarray, idx: np.ndarray, back: int) -> np.ndarray:
    """For each index ``i`` in ``idx`` (a high point of ``x`` above its level), whether its
    rise was one step's doing: from ``i`` up the descent it may sit on to the top of its
    excursion (at most ``back`` steps: the loss falling back after a batch, or after a
    climb), one step of the climb into that top made at least SHARE of the top's height above
    ``level`` there (the level just before it). A climb's highest points, on the way
    up or down, fail: each of its steps made a small part of the height; a batch's own
    step, and the steps falling back from it, pass. NaN ends a walk up."""
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros(len(idx), dtype=bool)
    for k, i in enumerate(np.asarray(idx, dtype=int)):
        t = i
        while t > 0 and i - t < back and np.isfinite(x[t - 1]) and x[t - 1] >= x[t]:
            t -= 1
        if t == 0:
            out[k] = True  # (nothing before it: a start is no climb)
            continue
        lv = float(level[t]) if np.isfinite(level[t]) else float(x[t - 1])
        height = float(x[t]) - lv
        # the climb into the top: the steps rising into it, one after another
        s = t
        while s > 0 and t - s < back and np.isfinite(x[s - 1]) and x[s - 1] < x[s]:
            s -= 1
        out[k] = height > 0 and float(np.max(np.diff(x[s:t + 1]))) >= SHARE * height
    return out
