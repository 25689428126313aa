"""Gradients that went exactly to zero and stayed there: dead units read from the gradients
(dead_activation, for runs recorded without activation statistics).

A parameter's gradient is exactly zero at a step only when every path from the loss to it
was multiplied by an exact zero: a ReLU whose inputs are all negative passes none (the
layers feeding it get none, the layer it feeds gets none for its weight: its input is
zero), so does a mask or a gate held at zero. A frozen parameter (requires_grad=False) or
one outside the graph has no gradient at all (the recorder writes no row for it), and
rounding never gives an exact zero to a gradient that flows. A gradient that had values
and then is exactly zero at every recorded step to the end of the run is a path that died.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...stats.onset import trailing_run
from . import _data
from .base import Context

MIN_SPAN = 10
"""Steps the exact zeros must cover (with at least min_points recorded points): a dead
ReLU does not come back by itself, but a run that ends a few steps after its gradients
vanished (a crash, a last step with no backward) is too little to call a state."""


class Dead(NamedTuple):
    name: str
    since: int
    """The first step of the unbroken stretch of exactly-zero gradients to the end."""
    points: int


def dead_gradients(ctx: Context, min_points: int) -> list[Dead]:
    """The gradient tensors that had nonzero values at ``min_points`` recorded points or
    more, then were exactly zero at every recorded point to the end of the run, ``min_points``
    or more of them over MIN_SPAN steps or more; in model order."""
    series = _data.series_of(ctx, "grad")
    last = max((float(s["step0"][-1]) for s in series.values() if len(s["step0"])),
               default=None)
    out: list[Dead] = []
    for name, s in series.items():
        if not len(s["n"]) or float(s["step0"][-1]) < (last or 0):
            continue  # (a tensor no longer recorded at the end: not dead, gone)
        i = trailing_run((s["n_zero"] >= s["n"]) & (s["n"] > 0))
        if i == 0 or i == len(s["n"]):
            continue  # (zero from the first point: never had one; or alive at the end)
        had = float(np.sum(s["n"][:i] - s["n_zero"][:i]))
        points = int(np.sum(s["n"][i:]))
        since = int(s["step0"][i])
        if had >= min_points and points >= min_points and (last or 0) - since >= MIN_SPAN:
            out.append(Dead(name, since, points))
    order = {n: k for k, n in enumerate(_data.model_order(ctx, "grad"))}
    return sorted(out, key=lambda d: order.get(d.name, 0))


def module_of(param: str) -> str:
    """The module that holds a parameter (``fc1.weight`` → ``fc1``)."""
    return param.rsplit(".", 1)[0] if "." in param else param


def where_it_stops(dead: list[Dead], names: list[str]) -> str:
    """The module at whose output the gradient stops. ``names``: every gradient tensor's
    name in model order. The dead tensors from the first one on, unbroken in model order,
    are the layers before the dead units and the one whose output died; after them come
    the layers that read the dead output: a layer's weight gets no gradient when its input
    is dead, but its bias still learns (it is not all dead), and a weight-only layer (a
    convolution before BatchNorm) last among the all-dead ones, with a live tensor or a
    reader after it, is such a reader too.
    The last all-dead module of that run, not such a reader, climbed to the highest module
    holding only dead tensors."""
    gone = {d.name for d in dead}
    if not any(n in gone for n in names):
        return module_of(dead[0].name)
    i = next(k for k, n in enumerate(names) if n in gone)
    j = i
    while j < len(names) and names[j] in gone:
        j += 1
    run = names[i:j]
    live_next = j < len(names)

    def inside(mod: str) -> list[str]:
        return [n for n in names if n.startswith(mod + ".")]

    def all_dead(mod: str) -> bool:
        return bool(inside(mod)) and all(n in gone for n in inside(mod))

    mods = list(dict.fromkeys(module_of(n) for n in run))
    whole = [m for m in mods if all_dead(m)]
    if len(whole) > 1 and len(inside(whole[-1])) == 1 and (live_next or whole[-1] != mods[-1]):
        whole = whole[:-1]  # (a weight-only reader of the dead output)
    if not whole:
        return module_of(run[-1])
    mod = whole[-1]
    while "." in mod and all_dead(module_of(mod)):
        mod = module_of(mod)
    return mod
