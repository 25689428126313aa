"""A rescaled objective: the loss and the gradient norm change by the same factor at the same
step, and stay there.

A training loop that starts weighting its loss differently mid-run (an auxiliary term
switched on, a term added twice by a refactor, ``reduction="sum"`` instead of ``"mean"``)
multiplies the loss by k from one step to the next, and, because the gradient is linear in
the loss, every gradient by the same k at that very step (by another factor when only one
term of a sum is rescaled, but at the same step, the same way). A learning-rate change at
that step is the other way to get there; the caller rules it out. Only a rise is read
as a rescale: a loss and gradients that fall together at one step are a model finding its
solution (and judging what follows on a scale divided by that factor would make it a
divergence). Nothing else does that: a learning
rate that is too high makes the loss rise over many steps while the gradient norm grows
geometrically; a bad batch is one step that comes back down. Seen as a change of the
*objective*, the steps after it are judged on the rescaled level (a loss twice as high is
not a divergence; under Adam, which is invariant to the loss's scale, training goes on as
before), and the change itself is reported for what it is: "the loss and every gradient ×2
at step 100".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_FACTOR = 1.5
"""Smallest rescale looked for (either way): smaller level changes are within what a
schedule or a curriculum does to a loss over a few steps."""
NOISE_Z = 5.0
"""The loss's shift is this many standard errors of the difference of two window medians
(from its own step-to-step noise); the gradient norm's, 3."""
MIN_POINTS = 40


@dataclass(frozen=True)
class Shift:
    index: int
    """Position in the series of the first rescaled step."""
    step: int
    factor: float
    """The loss's factor (after / before)."""
    grad_factor: float

    def text(self) -> str:
        return (f"the loss and the gradient norm changed ×{self.factor:.3g} and "
                f"×{self.grad_factor:.3g} at step {self.step}, and stayed there")


def _sigma(x: np.ndarray) -> float:
    d = np.diff(x)
    return 1.4826 * float(np.median(np.abs(d - np.median(d)))) / np.sqrt(2)


def _med(a: np.ndarray) -> float:
    return float(np.median(a)) if len(a) else float("nan")


def objective_shift(step: np.ndarray, loss: np.ndarray, grad_norm: np.ndarray
                    ) -> Shift | None:
    """The one step at which loss (by ≥ MIN_FACTOR, significantly: NOISE_Z) and gradient
    norm (the same way, significantly) jump together, and stay: the medians of
    ``w`` points before and after agree with the medians of the points further on. Series
    aligned by position; non-positive or nonfinite values are not used. None when there is
    no such step."""
    ok = np.isfinite(loss) & (loss > 0) & np.isfinite(grad_norm) & (grad_norm > 0)
    idx = np.flatnonzero(ok)
    if len(idx) < MIN_POINTS:
        return None
    lg, gg = np.log(loss[idx]), np.log(grad_norm[idx])
    n = len(idx)
    w = max(10, n // 20)
    # standard error of a difference of two medians of w points: 1.25·σ·√(2/w), σ per point
    # from the step-to-step differences (robust: 1.4826·MAD/√2)
    se_l, se_g = (1.25 * _sigma(x) * np.sqrt(2 / w) for x in (lg, gg))
    best: tuple[float, int, float, float] | None = None
    for i in range(2 * w, n - 2 * w + 1):  # (a level held before it, and after)
        dl = _med(lg[i:i + w]) - _med(lg[i - w:i])
        # upward only: loss and gradients that fall together at one step are what a model
        # finding the solution looks like (a learning transition), and dividing what
        # follows by that factor would turn it into a divergence
        if dl < np.log(MIN_FACTOR) or dl < NOISE_Z * se_l:
            continue
        dg = _med(gg[i:i + w]) - _med(gg[i - w:i])
        # the gradient norm corroborates: shifted the same way at the same step,
        # significantly (3 standard errors). (Not by the same factor: when one term of a
        # sum is rescaled, the loss and the gradient change by different factors.)
        if dg * dl <= 0 or abs(dg) < max(3 * se_g, np.log(MIN_FACTOR) / 2):
            continue
        # abrupt: the step itself already sits at the new level (not a ramp through it)
        if abs((lg[i] - _med(lg[i - w:i])) - dl) > abs(dl) / 2:
            continue
        # a step between two levels: further on it stays at the new level (neither back
        # nor on: a divergence keeps going), and before it the level held
        later = _med(lg[i + w:i + 2 * w]) - _med(lg[i - w:i])
        if abs(later - dl) > abs(dl) / 2:
            continue
        if abs(_med(lg[i - w:i]) - _med(lg[i - 2 * w:i - w])) > abs(dl) / 2:
            continue
        if best is None or abs(dl) > best[0]:
            best = (abs(dl), i, dl, dg)
    if best is None:
        return None
    _, i, dl, dg = best
    i = _exact(lg, i, w)
    # at the new level from its first step, the loss and the gradient norm alike: a step
    # that overshoots the level that follows by more than the shift itself and far beyond
    # one point's noise (the gradient x1000 where it then holds x8) is a batch that threw
    # the run, and what follows is the model knocked back, not a rescale
    for series, d, se in ((lg, dl, se_l), (gg, dg, se_g)):
        over = series[i] - _med(series[i - w:i]) - d
        if over > max(abs(d), 4 * se * np.sqrt(w / 2) / 1.25):
            return None
    return Shift(int(idx[i]), int(step[idx[i]]), float(np.exp(dl)), float(np.exp(dg)))


def _exact(lg: np.ndarray, i: int, w: int) -> int:
    """The step of the change near ``i``: the split of [i − w, i + w) between the two levels
    (the window medians around ``i``) with the least absolute error. Window medians hardly
    move while the change is inside either window: the split does."""
    a, b = _med(lg[i - w:i]), _med(lg[i:i + w])
    lo, hi = max(w // 2, i - w // 2), min(len(lg) - w // 2, i + w // 2 + 1)
    seg = lg[i - w:i + w]
    costs = [np.abs(seg[:j - (i - w)] - a).sum() + np.abs(seg[j - (i - w):] - b).sum()
             for j in range(max(lo, i - w + 1), min(hi, i + w))]
    return max(lo, i - w + 1) + int(np.argmin(costs)) if costs else i
