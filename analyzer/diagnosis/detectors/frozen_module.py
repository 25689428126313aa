"""frozen_module: a whole module is frozen (requires_grad=False, outside the optimizer)
while the rest of the model trains. Named, as information: a frozen backbone or embedding
is often meant; a block frozen by mistake is the first thing to rule out when a model
learns less than it should. (Frozen but still in the optimizer: ``optimizer_coverage``.)

Reads the recorder's ``param_coverage`` events (recorder/training/coverage.py).
"""

from __future__ import annotations

from typing import Any

from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _structure
from .base import Context
from .no_gradient import modules, recorded_steps

ID = "frozen_module"
NEEDS: tuple[str, ...] = ()
DEFAULTS: dict[str, Any] = {
    "min_steps": 2,  # as no_gradient: the coverage needs a couple of recorded steps
}
DOC = {
    "meaning": "A whole module is frozen (requires_grad=False, outside the optimizer) while "
               "the rest of the model trains.",
    "rule": "the recorder's last param_coverage event lists frozen parameters outside the "
            "optimizer, and the model has trainable ones too: info, named by the highest "
            "modules holding only frozen parameters.",
    "fixes": "Nothing to do if they are meant to stay fixed (a frozen backbone or "
             "embedding); else call requires_grad_(True) and add them to the optimizer.",
}


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    cov = _structure.coverage(ctx)
    if cov is None or recorded_steps(ctx) < int(th.min_steps) or not cov["frozen"]:
        return []
    total = cov["parameters"]
    if total is not None and cov["counts"]["frozen"] >= total:
        return []  # nothing trains: not a module frozen among training ones
    mods = modules(ctx, cov, cov["frozen"])
    return [Finding(
        id=ID, severity="info", subject=mods[0], first_step=None,
        title=f"{_structure.describe(mods, 2)} frozen",
        message=(f"{_structure.describe(mods)} frozen: {cov['counts']['frozen']} "
                 f"parameter(s) ({cov['numel']['frozen']:,} values) with "
                 "requires_grad=False, outside the optimizer, while the rest trains."),
        advice=DOC["fixes"], chart=anchors.GRAD_HEATMAP,
        evidence={"modules": mods[:20], "count": cov["counts"]["frozen"],
                  "values": cov["numel"]["frozen"]})]
