"""dead_activation: a module's output is (almost) all zeros, e.g. dead ReLUs."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _data
from .base import Context

ID = "dead_activation"
NEEDS: tuple[str, ...] = ("NaN origin by module",)
DEFAULTS: dict[str, Any] = {
    "window_frac": 0.5,    # last half of the run
    "min_zero_frac": 0.99,  # mean share of exact zeros in the module's output
    "min_points": 3,
}
DOC = {
    "meaning": "A module's output is almost always zero (dead ReLU units): it passes no "
               "signal or gradient.",
    "rule": "activation zero_frac averaged over the last window_frac of the run ≥ "
            "min_zero_frac (needs activation statistics, preset debug); first_step is where "
            "the module went dead: the start of the unbroken stretch of dead points that "
            "reaches the window.",
    "fixes": "Lower the LR, LeakyReLU/GELU, better init, normalisation before the activation.",
}


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    acts = _data.series_of(ctx, "activation")
    if not acts:
        return []
    nb = int(max(s["bucket"].max() for s in acts.values())) + 1
    start = int(nb * (1 - float(th.window_frac)))
    dead = []
    for name, s in acts.items():
        sel = (s["bucket"] >= start) & np.isfinite(s["zero_frac"])
        if sel.sum() < th.min_points:
            continue
        z = float(np.average(s["zero_frac"][sel], weights=s["n"][sel]))
        if z >= th.min_zero_frac:
            dead.append((z, name, _onset(s, sel, float(th.min_zero_frac))))
    if not dead:
        return []
    order = {n: i for i, n in enumerate(_data.model_order(ctx, "activation"))}
    dead.sort(key=lambda x: order.get(x[1], 0))
    z, name, first = dead[0]
    return [Finding(
        id=ID, severity="warning", subject=name, first_step=first,
        title=f"Dead activations in {len(dead)} module(s)",
        message=(f"{len(dead)} module(s) output almost only zeros in the last part of the run; "
                 f"first {name}: {100 * z:.1f}% zeros."),
        advice=DOC["fixes"], chart=anchors.ACTIVATIONS,
        evidence={"modules": [n for _, n, _ in dead[:20]], "zero_frac": z,
                  "count": len(dead)})]


def _onset(s: dict[str, np.ndarray], sel: np.ndarray, dead_at: float) -> int:
    """The first step of the unbroken stretch of dead points (zero_frac ≥ ``dead_at``) that
    runs into the judged window: when the units died, not where the window starts."""
    ok = np.isfinite(s["zero_frac"])
    step, z = s["step0"][ok], s["zero_frac"][ok]
    first = int(np.flatnonzero(sel[ok])[0]) if sel[ok].any() else len(z) - 1
    i = first
    while i > 0 and z[i - 1] >= dead_at:
        i -= 1
    return int(step[i])
