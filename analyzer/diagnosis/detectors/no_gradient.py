"""no_gradient: every parameter is accounted for. One that is trainable and in the optimizer
yet never holds a gradient after backward does not learn: its module runs, but nothing it
computes reaches the loss — the graph is cut after it (a ``.detach()``, ``torch.no_grad()``,
``.data``, a tensor rebuilt from numpy) or its output is computed and never used (a last
residual branch nobody reads). Frozen modules are ``frozen_module``'s.

Reads the recorder's ``param_coverage`` events (recorder/training/coverage.py): per
parameter, whether it ever had a ``.grad``. Modules whose forward never ran are ``unused_module``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _data, _structure
from .base import Context

ID = "no_gradient"
NEEDS: tuple[str, ...] = ()
DEFAULTS: dict[str, Any] = {
    "min_steps": 2,  # gradients must have been read at this many recorded steps (a run
                     # stopped after its first step has not shown which branches train)
}
DOC = {
    "meaning": "Trainable parameters in the optimizer never receive a gradient: what "
               "their module computes never reaches the loss (the graph is cut after it, "
               "or its output is not used).",
    "rule": "the recorder's last param_coverage event lists parameters with requires_grad "
            "that are in the optimizer (or no optimizer is known) and whose .grad was None "
            "at every step it read, over at least min_steps recorded steps, and whose "
            "module's forward ran (else unused_module): warning, named by the highest "
            "module holding only such parameters.",
    "fixes": "Look for .detach(), torch.no_grad(), .data or a tensor rebuilt from "
             ".item()/numpy between these modules and the loss, or an output computed and "
             "never used (use it, or drop the layer); if they are meant not to train, set "
             "requires_grad_(False) and leave them out of the optimizer (DDP needs "
             "find_unused_parameters=True otherwise).",
}


def universe(ctx: Context, cov: Mapping[str, Any]) -> list[str]:
    """Every parameter name the run shows: gradients recorded plus the listed states."""
    names = list(_data.model_order(ctx, "grad"))
    for s in _structure.STATES:
        names += cov[s]
    return list(dict.fromkeys(names))


def modules(ctx: Context, cov: Mapping[str, Any], names: list[str]) -> list[str]:
    """The module paths that hold ``names`` (the highest ones when the run shows every
    parameter; else each parameter's own module)."""
    every = universe(ctx, cov)
    if cov["parameters"] is None or len(every) < cov["parameters"]:
        return list(dict.fromkeys(_structure.module_of(n) or n for n in names))
    chosen = set(names)
    return _structure.covering_modules(names, [n for n in every if n not in chosen])


def recorded_steps(ctx: Context) -> int:
    return int(ctx.rows("SELECT count(DISTINCT step) FROM steps")[0][0] or 0)


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    cov = _structure.coverage(ctx)
    if cov is None or recorded_steps(ctx) < int(th.min_steps):
        return []
    out = []
    unused = set(_structure.structure(ctx)["not_called"])
    cut = [n for n in cov["no_grad"] if _structure.module_of(n) not in unused]
    if cut:
        mods = modules(ctx, cov, cut)
        out.append(Finding(
            id=ID, severity="warning", subject=mods[0], first_step=cov["first_step"],
            title=f"{len(cut)} trainable parameter(s) never receive a gradient",
            message=(f"{_structure.describe(mods)}: {len(cut)} parameter(s) "
                     f"({cov['numel']['no_grad']:,} values) that require grad"
                     + (" and are in the optimizer" if cov["optimizer_known"] else "")
                     + " had no .grad after any backward pass, although the module runs: "
                     "nothing it computes reaches the loss (the graph is cut after it, or "
                     "its output is not used), so they never learn."),
            advice=DOC["fixes"], chart=anchors.GRAD_HEATMAP,
            evidence={"modules": mods[:20], "parameters": cut[:50], "count": len(cut),
                      "values": cov["numel"]["no_grad"],
                      "parameters_total": cov["parameters"]}))
    return out
