"""optimizer_coverage: the optimizer and the model disagree. A trainable parameter in no
param group gets gradients that nothing applies (the classic ``optimizer =
Adam(model.encoder.parameters())`` after adding a head); a frozen parameter in the optimizer
is usually a block frozen by mistake, or a freeze that was meant to be undone.

From the recorder's ``param_coverage`` events (recorder/training/coverage.py), which compare
``requires_grad`` with the optimizer's param groups.
"""

from __future__ import annotations

from typing import Any

from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _structure, no_gradient
from .base import Context

ID = "optimizer_coverage"
NEEDS: tuple[str, ...] = ()
DEFAULTS: dict[str, Any] = {}
DOC = {
    "meaning": "Trainable parameters that no optimizer param group holds (error), or frozen "
               "parameters handed to the optimizer (warning).",
    "rule": "from the recorder's param_coverage event (requires_grad against the optimizer's "
            "param groups). Trainable and outside the optimizer: error when the recorded "
            "weight statistics show them unchanged through the run, warning when there are "
            "none to tell, nothing when they changed (another optimizer steps them, as in a "
            "GAN). Frozen (requires_grad=False) yet in a param group: warning. Each is dated "
            "from the event from which every later one listed those parameters so (a block "
            "unfrozen mid-run and left out of the optimizer, an optimizer bound at a resume "
            "to a model the checkpoint was not loaded into), and weights are judged "
            "unchanged from there.",
    "fixes": "Build the optimizer from every trainable parameter after the model is complete "
             "(e.g. [p for p in model.parameters() if p.requires_grad]); unfreeze the block "
             "if it was meant to train.",
}


def _changed(ctx: Context, since: int | None) -> tuple[set[str], set[str]]:
    """(names whose recorded weight norm changed, names with at least two weight rows), over
    the steps from ``since``, where they came to be outside the optimizer (the training
    before it moved them, not what this optimizer does)."""
    rows = ctx.rows("SELECT name, min(norm) <> max(norm), count(*) FROM tensor_stats "
                    "WHERE kind = 'param' AND isfinite(norm) AND step >= ? GROUP BY name",
                    [since if since is not None else -(2**62)])
    return ({str(n) for n, ch, _ in rows if ch}, {str(n) for n, _, c in rows if c >= 2})


def _first(cov: dict[str, Any], state: str) -> Any:
    """The step the state began (_structure._onsets), else the first coverage event's."""
    onset = cov["onset"].get(state)
    return onset if onset is not None else cov["first_step"]


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    cov = _structure.coverage(ctx)
    if cov is None or not cov["optimizer_known"]:
        return []
    out = []
    outside = cov["not_in_optimizer"]
    if outside:
        since = cov["onset"].get("not_in_optimizer")
        changed, seen = _changed(ctx, since)
        moved = [n for n in outside if n in changed]
        still = [n for n in outside if n in seen and n not in changed]
        unknown = [n for n in outside if n not in seen]
        if len(moved) < len(outside):
            names = still + unknown
            mods = no_gradient.modules(ctx, cov, names)
            out.append(Finding(
                id=ID, severity="error" if still else "warning", subject=mods[0],
                first_step=_first(cov, "not_in_optimizer"),
                title=f"{len(names)} trainable parameter(s) are in no optimizer param group",
                message=(f"{_structure.describe(mods)}: {len(names)} parameter(s) "
                         "require grad but the optimizer does not hold them"
                         + (", and their recorded weights never changed: they do not train."
                            if still else " (no weight statistics say whether another "
                            "optimizer steps them).")),
                advice=DOC["fixes"], chart=anchors.GRAD_HEATMAP,
                evidence={"modules": mods[:20], "parameters": names[:50],
                          "count": len(names), "unchanged": len(still)}))
    frozen = cov["frozen_in_optimizer"]
    if frozen:
        mods = no_gradient.modules(ctx, cov, frozen)
        out.append(Finding(
            id=ID, severity="warning", subject=mods[0],
            first_step=_first(cov, "frozen_in_optimizer"),
            title=f"{_structure.describe(mods, 2)} frozen, yet in the optimizer",
            message=(f"{_structure.describe(mods)}: {cov['counts']['frozen_in_optimizer']} "
                     "parameter(s) have requires_grad=False but are in an optimizer param "
                     "group: they never train. Frozen on purpose, they belong outside the "
                     "optimizer; by mistake, unfreeze them."),
            advice=DOC["fixes"], chart=anchors.GRAD_HEATMAP,
            evidence={"modules": mods[:20], "parameters": frozen[:50],
                      "count": cov["counts"]["frozen_in_optimizer"]}))
    return out
