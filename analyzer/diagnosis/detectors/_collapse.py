"""The whole model's gradient collapses for good while the loss stays where it was (issue 45:
a loss divided by its scale instead of multiplied after a resume; gradients ×1e-6, training
frozen for half the run, and no layer below "the median layer", since every layer fell).

The per-layer rule of :mod:`.vanishing_gradient` compares layers with each other; when all of
them fall together, the comparison is with the model's own gradient before. A gradient falls
as a model converges, but the loss falls with it: near a minimum the loss goes as the
gradient's square (a quadratic basin) or in proportion (cross-entropy on fitted data). A total
gradient norm that falls ``fall`` times (three decades: beyond any step-to-step scatter, and
beyond a learning-rate decay's effect on the gradient) while the loss falls less than
``loss_fall`` times over the same steps is a model that stopped receiving gradient, not one
that reached a minimum. Exact zeros are left to the dead-gradient rules (a cut graph, dead
units): they are not a vanishing norm.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...stats import robust as _stats
from ...stats.onset import trailing_run
from .. import anchors
from ..findings import Finding
from . import _data
from .base import Context

FALL = 1000.0
"""The total gradient norm's fall from its earlier level to its late one (three decades)."""
LOSS_FALL = 10.0
"""... while the loss, over the same steps, falls less than this many times (a converging
model's loss falls at least as many decades as its gradient, in a quadratic basin twice)."""
LATE = 0.25
"""The late level: the median over this last share of the run."""


def collapse(ctx: Context) -> dict[str, Any] | None:
    """{onset, before, after, fall, loss_before, loss_after} when the whole model's gradient
    collapsed for good without the loss falling with it; None otherwise."""
    r = _data.primary_rank(ctx, "grad_norm")
    if r is None:
        return None
    d = _data.steps(ctx)[r]
    step, g, loss = d["step"], d["grad_norm"], d["loss"]
    fin = np.isfinite(g)
    n = int(fin.sum())
    if n < 40:
        return None
    tail = g[fin][-max(10, int(n * LATE)):]
    if (tail == 0).mean() > 0.5:
        return None  # exact zeros: a cut graph or dead units (_zero_grads, dead_activation)
    ok = fin & (g > 0)
    s, lg = step[ok], np.log(g[ok])
    w = max(3, len(lg) // 50)
    sm = _stats.rolling_median(lg, w)
    k = max(10, int(len(lg) * LATE))
    late = float(np.median(lg[-k:]))
    before = float(np.nanmax(sm[:len(lg) - k]))
    if before - late < math.log(FALL):
        return None
    mid = (before + late) / 2
    i = trailing_run(sm < mid)  # where the smoothed norm went below the middle for good
    j = trailing_run(lg < mid)  # ... and the raw one, unless noise crossed back later
    at = j if j <= i + w else i
    if at <= w or len(lg) - at < k // 2:
        return None  # no earlier level to fall from, or not held long enough
    onset = int(s[at])
    # the level it fell from: just before, and no higher than all the run before it (a
    # burst's or a spike's peak came back down to where the run had been: not a collapse)
    level = min(float(np.median(lg[max(0, at - k // 2):at])), float(np.median(lg[:at])))
    if level - late < math.log(FALL):
        return None
    pre = (step < onset) & (step >= int(s[max(0, at - k // 2)])) & np.isfinite(loss)
    post = (step >= int(s[-k])) & np.isfinite(loss)
    if pre.sum() < 3 or post.sum() < 3:
        return None
    lb, la = float(np.median(loss[pre])), float(np.median(loss[post]))
    if lb > 0 and la > 0 and lb / la >= LOSS_FALL:
        return None  # the loss fell with it: convergence
    return {"onset": onset, "before": math.exp(level),
            "after": math.exp(late), "fall": math.exp(before - late),
            "loss_before": lb, "loss_after": la}


def finding(res: dict[str, Any], id_: str, advice: str) -> Finding:
    """The vanishing_gradient finding of :func:`collapse`'s result."""
    fall = res["before"] / res["after"] if res["after"] > 0 else res["fall"]
    return Finding(
        id=id_, severity="error", subject="grad_norm", first_step=res["onset"],
        title=f"Gradients vanished from step {res['onset']}: training stopped",
        message=(f"The total gradient norm fell from {res['before']:.3g} to "
                 f"{res['after']:.3g} (×{1 / fall:.2g}) at step {res['onset']} and stayed "
                 f"there, every layer with it, while the loss did not fall with it "
                 f"({res['loss_before']:.4g} before, {res['loss_after']:.4g} at the end): "
                 "from that step the model gets almost no gradient and nothing learns. A "
                 "fall at one step is a change in the code that computes the loss or its "
                 "backward (a loss divided by its scale instead of multiplied, a detach, a "
                 "rescale of the objective by orders of magnitude); a gradual one is units "
                 "saturating (sigmoid/tanh) or dying."),
        advice=advice, chart=anchors.GRAD_HEATMAP,
        evidence={"collapse": True, "onset_step": res["onset"],
                  "grad_norm_before": res["before"], "grad_norm_after": res["after"],
                  "fall": fall, "loss_before": res["loss_before"],
                  "loss_after": res["loss_after"]})
