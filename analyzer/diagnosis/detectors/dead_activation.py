"""dead_activation: a module's output is (almost) all zeros, e.g. dead ReLUs."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...stats.onset import trailing_run
from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _data, _zero_grads
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
            "min_zero_frac, or ≥ min_zero_frac at every point from some point to the "
            "module's last, at least min_points of them (a ReLU that dies gets no gradient "
            "and cannot come back by itself: dead from a step to the end is dead, wherever "
            "in the run it died; needs activation statistics, preset debug); first_step is "
            "where the module went dead: the start of the unbroken stretch of dead points "
            "that reaches the window, refined between the last live point and the first dead "
            "one by the per-step gradients: the first step from which more gradient tensors "
            "are exactly zero than at the last live point, to the first dead point (the "
            "layers feeding a dead ReLU get exactly none). Without activation statistics "
            "(the default preset): gradient tensors that had values at min_points recorded "
            "points or more, then were exactly zero at every recorded point to the end "
            "(min_points or more over MIN_SPAN steps): an exact zero means every path from "
            "the loss to them is multiplied by zero (dead ReLUs, a mask or gate held at "
            "zero; a frozen parameter has no gradient at all, rounding never gives an exact "
            "zero); dated at the first of them to go, named by the module at whose output "
            "the gradient stops (the highest module holding only dead tensors around the "
            "last whole dead module in model order).",
    "fixes": "Lower the LR, LeakyReLU/GELU, better init, normalisation before the activation.",
}


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    acts = _data.series_of(ctx, "activation")
    if not acts:
        return _from_gradients(ctx, th)
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
            continue
        # (dead from some point to the module's last, wherever in the run it died)
        ok = np.isfinite(s["zero_frac"])
        zf = s["zero_frac"][ok]
        i = trailing_run(zf >= th.min_zero_frac)
        if len(zf) - i >= th.min_points:
            dead.append((float(np.mean(zf[i:])), name, int(s["step0"][ok][i])))
    if not dead:
        return []
    order = {n: i for i, n in enumerate(_data.model_order(ctx, "activation"))}
    dead.sort(key=lambda x: order.get(x[1], 0))
    z, name, first = dead[0]
    first = _zero_grads_from(ctx, acts[name], first)
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


def _from_gradients(ctx: Context, th: Thresholds) -> list[Finding]:
    """Without activation statistics: the gradients that went exactly to zero mid-run and
    stayed there (_zero_grads.py), named by the module at whose output they stop."""
    dead = _zero_grads.dead_gradients(ctx, int(th.min_points))
    if not dead:
        return []
    since = min(d.since for d in dead)
    names = _data.model_order(ctx, "grad") or list(_data.series_of(ctx, "grad"))
    where = _zero_grads.where_it_stops(dead, names)
    mods = list(dict.fromkeys(_zero_grads.module_of(d.name) for d in dead))
    return [Finding(
        id=ID, severity="warning", subject=where,
        first_step=since,
        title=f"No gradient reaches {len(dead)} tensor(s) from step {since}: dead units",
        message=(f"The gradients of {len(dead)} tensor(s) in {len(mods)} module(s) "
                 f"({', '.join(mods[:6])}{', ...' if len(mods) > 6 else ''}) had values, "
                 f"then were exactly zero at every recorded step from step {since} to the "
                 f"end: the gradient stops at the output of {where}. An exact zero "
                 "means every path from the loss to them is multiplied by zero: ReLUs "
                 "whose inputs are all negative (dead units, which cannot "
                 "come back by themselves: no gradient reaches the weights that would "
                 "revive them), or a mask or gate held at zero. Record with preset='debug' "
                 "to see the activations."),
        advice=DOC["fixes"], chart=anchors.ACTIVATIONS,
        evidence={"tensors": [d.name for d in dead[:20]], "modules": mods[:20],
                  "count": len(dead), "from_gradients": True})]


def _zero_grads_from(ctx: Context, s: dict[str, np.ndarray], first: int) -> int:
    """The step the units died, between the last live activation point before ``first`` and
    ``first`` (activation statistics come every N steps): the first step from which more
    gradient tensors are exactly zero than at that live point, through ``first`` (the
    layers feeding a dead ReLU get exactly no gradient from the step it died). ``first``
    when the gradients do not say (not recorded per step, or no tensor went to zero)."""
    step = s["step0"][np.isfinite(s["zero_frac"])]
    before = step[step < first]
    r = _data.tensor_rank(ctx)
    if not len(before) or r is None:
        return first
    lo = int(before[-1])
    rows = ctx.rows(
        "SELECT step, count(*) FILTER (WHERE norm = 0) FROM tensor_stats "
        "WHERE rank = ? AND kind = 'grad' AND step BETWEEN ? AND ? GROUP BY step "
        "ORDER BY step", [r, lo, first])
    if len(rows) < 2 or int(rows[0][0]) != lo:
        return first
    base = int(rows[0][1])
    onset = first
    for st, zeros in reversed(rows[1:]):  # (the unbroken stretch above the base, to first)
        if int(zeros) <= base:
            break
        onset = int(st)
    return onset
