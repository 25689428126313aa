"""unused_module: a module holding trainable parameters whose forward never runs in
training (a branch the model builds but never takes: a head left from an older design, a
layer list indexed short). Its parameters never get a gradient, take memory and optimizer
state, and under DistributedDataParallel need ``find_unused_parameters=True``.

From the recorder's ``model_structure`` event (modules not called in the first training
forward) and ``param_coverage`` (their parameters never got a gradient afterwards either).
"""

from __future__ import annotations

from typing import Any

from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _structure, no_gradient
from .base import Context

ID = "unused_module"
NEEDS: tuple[str, ...] = ()
DEFAULTS: dict[str, Any] = {
    "min_steps": 2,  # as no_gradient: enough recorded steps to have seen the branches
}
DOC = {
    "meaning": "Modules with trainable parameters never run in training: dead code that "
               "holds memory and optimizer state.",
    "rule": "a module holding parameters did not run in the first training forward "
            "(model_structure event) and its trainable parameters never had a gradient "
            "over at least min_steps recorded steps (param_coverage): warning, named by "
            "the highest such module.",
    "fixes": "Remove the module, or call it where it was meant to be used (a branch, a "
             "loop over layers that stops early, a head that is never applied).",
}


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    cov = _structure.coverage(ctx)
    if cov is None or no_gradient.recorded_steps(ctx) < int(th.min_steps):
        return []
    unused = set(_structure.structure(ctx)["not_called"])
    names = [n for n in cov["no_grad"] if _structure.module_of(n) in unused]
    if not names:
        return []
    mods = no_gradient.modules(ctx, cov, names)
    return [Finding(
        id=ID, severity="warning", subject=mods[0], first_step=cov["first_step"],
        title=f"{_structure.describe(mods, 2)} never run{'s' if len(mods) == 1 else ''}",
        message=(f"{_structure.describe(mods)}: {len(names)} trainable parameter(s) in "
                 "module(s) whose forward did not run in training, and that never got a "
                 "gradient."),
        advice=DOC["fixes"], chart=anchors.GRAD_HEATMAP,
        evidence={"modules": mods[:20], "parameters": names[:50], "count": len(names)})]
