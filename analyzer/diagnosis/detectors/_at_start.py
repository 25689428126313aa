"""A gradient that had already exploded at the run's first step(s), before there was a level to
grow from (issue 45: "step 0 when there is no calm prefix"). A bad initialisation (a recurrent
matrix with spectral radius 3, a layer scaled 1000x) gives a first gradient orders of magnitude
above anything the run sees later; the one unclipped update it drives is the damage.

A large first gradient alone is ordinary: a model at initialisation is far from any solution,
and its loss is large too. What marks an explosion is a gradient out of proportion to the loss:
the first norm is ``factor²`` (100x) above the run's later median *beyond* what the loss's own
fall explains (an unnormalised regression starts at loss 1e6 and gradient 1e3, and both fall
together; a recurrent explosion starts at gradient 2e5 on a loss of 1, and the loss falls 6x).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _changes, _collapse, _data
from .base import Context

RECURRENT = re.compile(r"weight_hh|recurrent", re.IGNORECASE)
"""Gradients explode in a recurrent network through the recurrent Jacobian, multiplied at every
time step: its weight is the mechanism, whichever tensor's gradient ends up largest (the input
weights and biases receive the exploded gradient through it)."""


def explosion_at_start(ctx: Context, th: Thresholds) -> dict[str, Any] | None:
    """{onset, from, to, ratio, loss_ratio, name (the subject tensor or None), layers, big}
    when the run's first ``warmup_steps`` gradient norms hold one far out of proportion."""
    r = _data.primary_rank(ctx, "grad_norm")
    if r is None:
        return None
    d = _data.steps(ctx)[r]
    step, g, loss = d["step"], d["grad_norm"], d["loss"]
    ok = np.isfinite(g) & (g > 0)
    lo, _ = _data.step_range(ctx)
    head = int(th.warmup_steps)
    if ok.sum() < int(th.min_points) + head or lo is None or not ok[:head].any():
        return None
    # the level the run settles at, before its gradients vanished for good (_collapse: a
    # gradient that held its first level for 200 steps and then fell a million times, a
    # loss divided by its scale, was not exploded at step 0)
    col = _collapse.collapse(ctx)
    before = ok if col is None else ok & (step < col["onset"])
    if before.sum() < int(th.min_points) + head:
        return None
    later = float(np.median(g[before][head:]))
    big = float(th.factor) ** 2
    first = [i for i in range(head) if ok[i] and g[i] >= big * later]
    if not first or int(step[first[0]]) > lo + head:
        return None
    i = first[0]
    fl = np.isfinite(loss) & (loss > 0)
    loss_ratio = 1.0
    if fl[i] and fl[head:].sum() >= int(th.min_points):
        loss_ratio = max(1.0, float(loss[i]) / float(np.median(loss[head:][fl[head:]])))
    ratio = float(g[i]) / later
    if ratio < big * loss_ratio:
        return None  # the loss was as far from its later level: a far start, not an explosion
    name, layers = _subject(ctx, int(step[i]), big)
    return {"onset": int(step[i]), "from": later, "to": float(g[i]),
            "ratio": ratio, "loss_ratio": loss_ratio, "name": name, "layers": layers,
            "big": big}


def _subject(ctx: Context, at: int, big: float) -> tuple[str | None, list[str]]:
    """The tensors whose gradient at ``at`` is ``big`` times their own later median, most
    first; the subject is the recurrent weight among them, else the most."""
    out: list[tuple[float, str]] = []
    for name, s in _data.series_of(ctx, "grad").items():
        x = s["log_norm"]
        k = np.flatnonzero(s["step0"] == at)
        rest = x[s["step0"] > at]
        rest = rest[np.isfinite(rest)]
        if not len(k) or not np.isfinite(x[k[0]]) or len(rest) < 3:
            continue
        up = float(np.exp(x[k[0]] - np.median(rest)))
        if up >= big:
            out.append((up, name))
    names = [n for _, n in sorted(out, reverse=True)]
    rec = [n for n in names if RECURRENT.search(n)]
    return (rec[0] if rec else names[0] if names else None), names


def finding(ctx: Context, res: dict[str, Any], id_: str, advice: str) -> Finding:
    """The gradient_explosion finding of :func:`explosion_at_start`'s result."""
    subject = res["name"] or "grad_norm"
    layers = res["layers"]
    msg = (f"The total gradient norm was {res['to']:.3g} at step {res['onset']}, "
           f"{res['ratio']:.3g}× the {res['from']:.3g} the run later settles at, while the "
           f"loss was only {res['loss_ratio']:.3g}× its later level: the gradient had "
           "exploded at the first step, before there was a level to grow from (an "
           "initialisation far too large, an unnormalised input), and the unclipped update "
           "it drives is the damage.")
    if layers:
        msg += (f" {len(layers)} tensor(s) at ≥{res['big']:g}× their own later level"
                + (f"; {subject} is the recurrent weight, through which a recurrent "
                   "network's gradient explodes" if RECURRENT.search(subject) else
                   f", most: {subject}") + ".")
    msg += _changes.early_lr_note(ctx, int(res["onset"]))
    return Finding(
        id=id_, severity="error", subject=subject, first_step=int(res["onset"]),
        title=f"Gradient explosion at step {res['onset']}",
        message=msg, advice=advice, chart=anchors.GRAD_HEATMAP,
        evidence={"onset_step": res["onset"], "crossing_step": res["onset"],
                  "norm_at_onset": res["from"], "norm_at_crossing": res["to"],
                  "growth_per_step": None, "max_norm": res["to"],
                  "first_nonfinite_step": None, "total_norm_exploded": True,
                  "layers": layers[:10], "layers_exploding": len(layers), "cause": None,
                  "at_start": True, "loss_ratio": res["loss_ratio"]})

