"""Scheduled ramps: a metric the run logs that the loop raises by design.

A loss built as ``task + w(t) · aux`` with ``w`` ramped (a consistency weight warmed up
over the first N steps, KL annealing in a VAE, an auxiliary or distillation term phased in)
rises while ``w`` rises: the objective is being re-weighted, the training is not getting
worse. So does a loss under a scheduled difficulty (an adversarial epsilon raised, a
pruning schedule's sparsity, a curriculum's level) the loop logs. Structure by design
explains, it does not alarm (issue 45): a loss divergence whose rise began while such a
ramp rose is reported at info, and the steps after the ramp settled are judged on their
own (loss_divergence); a plateau is judged only at the final weight (loss_plateau).

A logged metric is read as a scheduled ramp when its shape can be nothing else:

* it never decreases over the whole run (a measured quantity, a loss term or an accuracy,
  goes down now and then over hundreds of noisy steps; a schedule does not);
* it ramps smoothly: RAMP_MIN_LEVELS distinct values or more, and no single step adds more
  than RAMP_MAX_JUMP of the total rise (a switch or an epoch counter moves in a few jumps);
* it rises RAMP_RISE-fold or from zero;
* it is not a counter: a ramp still rising at the end must take non-integer values (steps,
  epochs, tokens and samples seen count in integers and grow to the end);
* it is not the learning rate under another name (proportional to the recorded LR).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _data
from .base import Context

RAMP_MIN_LEVELS = 10
"""Distinct values a ramp takes at least: a schedule computed per step takes one per step of
its ramp (hundreds); a switch takes 2, an epoch counter over a short run a handful."""
RAMP_MAX_JUMP = 0.25
"""The largest share of the total rise one step may add: a smooth ramp adds 1/steps of it
per step (under 1% over 100 steps); a stepped schedule of 4 stages or fewer, which moves the
objective at once like a switch (the rescale rule's business), adds a quarter or more."""
RAMP_RISE = 2.0
"""How far a ramp must rise (or from 0): a weight that doubles changes what the loss sums
as much as a rescale by 2 (stats/shift's smallest, ×1.5, with margin); BYOL's τ 0.996 -> 1
moves nothing the loss reports."""
SETTLED_MIN = 20
"""Steps at the final weight needed to judge the loss there (loss_divergence's min_steps)."""


def ramps(ctx: Context) -> list[dict[str, Any]]:
    """The run's scheduled objective weights on the loss's rank, each {name, start (the first
    step it rose), end (the first step at its final value, None while still rising at the
    end or with fewer than SETTLED_MIN steps left), first, last (values)}."""

    def load() -> list[dict[str, Any]]:
        r = _data.primary_rank(ctx, "loss")
        if r is None:
            return []
        # (candidates in SQL: never decreasing, enough distinct values; the rest in numpy)
        names = [n for (n,) in ctx.rows(
            "SELECT name FROM (SELECT name, value, lag(value) OVER (PARTITION BY name "
            "ORDER BY step) AS prev FROM metrics WHERE rank = ? AND isfinite(value)) "
            "GROUP BY name HAVING count(*) FILTER (WHERE value < prev) = 0 "
            "AND count(DISTINCT value) >= ? ORDER BY name LIMIT 64", [r, RAMP_MIN_LEVELS])]
        out = []
        for name in names:
            cols = ctx.arrays("SELECT step, value FROM metrics WHERE rank = ? AND name = ? "
                              "AND isfinite(value) ORDER BY step", [r, name])
            step = np.asarray(cols["step"], np.int64)
            value = np.asarray(cols["value"], np.float64)
            ramp = _ramp(str(name), step, value)
            if ramp is not None and not _is_lr(ctx, r, step, value):
                out.append(ramp)
        return out

    return ctx.cached("objective_ramps", load)


def _ramp(name: str, step: np.ndarray, v: np.ndarray) -> dict[str, Any] | None:
    """The ramp ``v`` over ``step`` describes (module docstring), or None."""
    if len(v) < RAMP_MIN_LEVELS or v[0] < 0:
        return None
    lo, hi = float(v[0]), float(v[-1])
    rise = hi - lo
    if not (rise > 0 and (lo == 0 or hi >= RAMP_RISE * lo)):
        return None
    if float(np.max(np.diff(v))) > RAMP_MAX_JUMP * rise:
        return None
    at_top = np.flatnonzero(v >= hi - 1e-9 * abs(hi))
    end = int(step[at_top[0]])
    settled = int(step[-1]) - end >= SETTLED_MIN
    if not settled and np.all(v == np.round(v)):
        return None  # a counter
    started = np.flatnonzero(v > lo)
    return {"name": name, "start": int(step[started[0] - 1]) if len(started) else end,
            "end": end if settled else None, "first": lo, "last": hi}


def _is_lr(ctx: Context, r: int, step: np.ndarray, v: np.ndarray) -> bool:
    """Is the metric (``v`` at ``step``) the learning rate: a fixed multiple of the recorded
    LR where both were recorded, within 1%?"""
    d = _data.steps(ctx).get(r)
    if d is None or not np.isfinite(d["lr"]).any():
        return False
    i = np.minimum(np.searchsorted(d["step"], step), len(d["step"]) - 1)
    same = d["step"][i] == step
    lr, v = d["lr"][i[same]], v[same]
    good = np.isfinite(lr) & (lr > 0) & (v > 0)
    if good.sum() < RAMP_MIN_LEVELS:
        return False
    ratio = v[good] / lr[good]
    return bool(np.max(ratio) <= 1.01 * np.min(ratio))


def over(ctx: Context, step: int) -> dict[str, Any] | None:
    """The scheduled ramp that was rising at ``step`` (from its start to its end, or to
    the end of the run while still rising), the one that ramps longest when several did."""
    hits = [w for w in ramps(ctx)
            if w["start"] <= step and (w["end"] is None or step <= w["end"])]
    return max(hits, key=lambda w: (w["end"] is None, w["end"] or 0), default=None)


def last_end(ctx: Context) -> tuple[dict[str, Any] | None, bool]:
    """(the ramp that settled last, whether a ramp is still rising at the end)."""
    rs = ramps(ctx)
    settled = [w for w in rs if w["end"] is not None]
    return (max(settled, key=lambda w: w["end"], default=None),
            any(w["end"] is None for w in rs))


def text(w: dict[str, Any]) -> str:
    """"`consistency_w`, logged, ramped from 0.4 to 10 over steps 0–250"."""
    until = f"{w['end']:,}" if w["end"] is not None else "the end"
    return (f"`{w['name']}`, logged, ramped from {w['first']:.3g} to {w['last']:.3g} "
            f"over steps {w['start']:,}–{until}")
