"""update_ratio: ‖update‖/‖weight‖ per step far from the healthy ~1e-3 (kind=update rows)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...stats.onset import trailing_run
from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _data
from .base import Context

ID = "update_ratio"
NEEDS: tuple[str, ...] = ()
DEFAULTS: dict[str, Any] = {
    "window_frac": 0.5,    # judge the last half of the run (zero-init biases settle first)
    "high": 0.1,           # geometric-mean ratio above this: the LR is far too high
    "low": 1e-6,           # below this (or exact zero updates): parameters barely move
    "min_points": 3,
}
DOC = {
    "meaning": "Parameter updates are far too large or too small relative to the weights "
               "(healthy is around 1e-3 per step).",
    "rule": "per tensor, geometric mean of ratio = ‖update‖/‖param‖ over the last "
            "window_frac of the run > high or < low (exact-zero updates count as low); "
            "first_step is where the unbroken stretch of points out of range that runs to "
            "the tensor's last point began, when that is inside the window (units that died "
            "mid-run), else the window's start.",
    "fixes": "Too high: lower the LR, warm-up, clip. Too low / zero: raise the LR, check the "
             "optimizer holds these parameters, weight decay vs LR, frozen layers.",
}


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    upd = _data.series_of(ctx, "update")
    if not upd:
        return []
    order = {n: i for i, n in enumerate(_data.model_order(ctx, "update"))}
    nb = int(max(s["bucket"].max() for s in upd.values())) + 1
    start = int(nb * (1 - float(th.window_frac)))
    high, low = [], []
    for name, s in upd.items():
        sel = s["bucket"] >= start
        n = s["n"][sel]
        if n.sum() < th.min_points:
            continue
        zeros = s["n_ratio_zero"][sel].sum()
        lr = s["log_ratio"][sel]
        ok = np.isfinite(lr)
        nz = n[ok] - s["n_ratio_zero"][sel][ok]
        if zeros >= 0.5 * n.sum() or not ok.any():
            low.append((0.0, name))
            continue
        g = float(np.exp(np.average(lr[ok], weights=np.maximum(nz, 1))))
        if g > th.high:
            high.append((g, name))
        elif g < th.low:
            low.append((g, name))
    out = []
    for which, items in (("high", high), ("low", low)):
        if not items:
            continue
        items.sort(key=lambda x: (-x[0], order.get(x[1], 0)) if which == "high"
                   else (x[0], order.get(x[1], 0)))
        val, name = items[0]
        s = upd[name]
        first = int(s["step0"][np.searchsorted(s["bucket"], start)]) if start <= s[
            "bucket"].max() else int(s["step0"][0])
        first = max(first, _stretch_from(s, which, th))
        total = len(upd)
        if which == "high":
            title = f"Updates too large in {len(items)} tensor(s)"
            msg = (f"{len(items)} of {total} tensors change by more than {th.high:g} of "
                   f"their norm per step; worst {name}: ratio ≈ {val:.3g} (healthy ≈ 1e-3).")
        else:
            frozen = all(v == 0.0 for v, _ in items)
            title = ("Parameters are not being updated" if frozen and len(items) == total
                     else f"Updates too small in {len(items)} tensor(s)")
            msg = (f"{len(items)} of {total} tensors change by less than {th.low:g} of their "
                   f"norm per step" + (" (exactly zero updates)" if val == 0.0 else
                                       f"; smallest {name}: ratio ≈ {val:.3g}")
                   + " (healthy ≈ 1e-3).")
        out.append(Finding(
            id=ID, severity="warning", subject=name, first_step=first, title=title,
            message=msg, advice=DOC["fixes"], chart=anchors.UPDATE_RATIO,
            evidence={"direction": which, "ratio": val, "tensors": [n for _, n in items[:20]],
                      "count": len(items), "tensors_total": total,
                      "log10_ratio": math.log10(val) if val > 0 else None}))
    return out


def _stretch_from(s: dict[str, np.ndarray], which: str, th: Thresholds) -> int:
    """The first step of the unbroken stretch of points out of range (``which`` side, or
    mostly zero updates for "low") that runs to the tensor's last point: where the updates
    went wrong when that happened inside the judged window (units that died mid-run), not
    the window's start. -1 when the last point is not out of range."""
    lr = s["log_ratio"]
    with np.errstate(invalid="ignore"):
        bad = (lr > math.log(th.high)) if which == "high" else (
            (s["n_ratio_zero"] >= 0.5 * s["n"]) | (lr < math.log(th.low)))
    i = trailing_run(bad)
    return int(s["step0"][i]) if i < len(bad) else -1
