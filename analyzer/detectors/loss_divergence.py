"""loss_divergence: the smoothed loss climbs well above its best level and stays there."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import anchors
from ..findings import Finding
from . import _data, _stats
from .base import Context

ID = "loss_divergence"
MAX_POINTS = 2000
DEFAULTS: dict[str, Any] = {
    "smooth_frac": 0.02,   # rolling-median window as a share of the steps ...
    "smooth_min": 5,       # ... at least this many steps
    "rise": 1.0,           # final level − best > rise × max(|best|, start − best)
    "tail_frac": 0.1,      # "final level" = median of the last tail_frac of the steps
    "max_p": 0.01,         # Mann–Kendall p of the rise after the best point
    "min_steps": 20,
}
DOC = {
    "meaning": "Training diverges: after reaching its best, the loss rises and stays high "
               "(or turns NaN).",
    "rule": "smoothed (rolling median) loss at the end exceeds the best smoothed loss by "
            "rise × max(|best|, start − best), the rise after the best is significant "
            "(Mann–Kendall p < max_p); nonfinite losses at the end count as diverged.",
    "fixes": "Lower the learning rate (often 3–10×), add warm-up, clip gradients, check the "
             "LR schedule, use bf16/loss scaling, normalise inputs.",
}


def detect(ctx: Context, th: Mapping[str, Any]) -> list[Finding]:
    r = _data.primary_rank(ctx, "loss")
    if r is None:
        return []
    d = _data.steps(ctx)[r]
    step_all, loss_all = d["step"], d["loss"]
    has = d["loss_given"]
    finite = np.isfinite(loss_all)
    if finite.sum() < th["min_steps"]:
        return []
    # a loss that ends nonfinite has diverged; use the finite prefix for the shape
    tail_nonfinite = bool(has.any() and not finite[np.flatnonzero(has)[-1]])
    step, loss = step_all[finite], loss_all[finite]
    if len(loss) > MAX_POINTS:
        # long runs: window medians first (the shape is what matters; keeps this O(n))
        x, y = _stats.bucket_series(step.astype(np.float64), loss, MAX_POINTS, how="median")
        step, loss = x.astype(np.int64), y
    w = max(int(th["smooth_min"]), int(len(loss) * float(th["smooth_frac"])))
    sm = _stats.rolling_median(loss, w)
    ib = int(np.nanargmin(sm))
    best = float(sm[ib])
    start = float(np.median(sm[: max(1, w)]))
    tail = max(w, int(len(loss) * float(th["tail_frac"])))
    end = float(np.median(loss[-tail:]))
    ref = max(abs(best), start - best, 1e-12)
    after = sm[ib:]
    z, p = _stats.mann_kendall(after) if len(after) >= 5 else (0.0, 1.0)
    rose = end - best > th["rise"] * ref and z > 0 and p < th["max_p"]
    if not (rose or (tail_nonfinite and ib < len(sm) - 1 and sm[-1] > best)):
        return []
    level = end if not tail_nonfinite else float("inf")
    onset_level = best + 0.1 * (min(end, best + 10 * ref) - best) if rose else best
    above = np.flatnonzero(after > onset_level)
    first = int(step[ib + above[0]]) if len(above) else int(step[ib])
    how = ("turned nonfinite" if tail_nonfinite and not rose
           else f"ends at {end:.4g}" + (" and then turned nonfinite" if tail_nonfinite else ""))
    return [Finding(
        id=ID, severity="error", subject="loss", first_step=first,
        title="Loss diverges",
        message=(f"The loss reached its best smoothed level {best:.4g} at step "
                 f"{int(step[ib])}, then rose from about step {first} and {how} "
                 f"(started at {start:.4g}; Mann–Kendall z={z:.1f}, p={p:.1e})."),
        advice=DOC["fixes"], chart=anchors.LOSS,
        evidence={"best_loss": best, "best_step": int(step[ib]), "start_loss": start,
                  "end_loss": level, "rank": r, "mk_z": z, "p_value": p,
                  "ended_nonfinite": tail_nonfinite})]
