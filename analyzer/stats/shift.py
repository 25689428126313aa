"""A rescaled objective: the loss and the gradient norm change by the same factor at the same
step, and stay there.

A training loop that starts weighting its loss differently mid-run (an auxiliary term
switched on, a term added twice by a refactor, ``reduction="sum"`` instead of ``"mean"``)
multiplies the loss by k from one step to the next, and, because the gradient is linear in
the loss, every gradient by the same k at that very step (by another factor when only one
term of a sum is rescaled, but at the same step, the same way). A learning rate that rose
into that step is the other way to get there; the caller rules it out (one that fell there
is the loop compensating its rescale, as with ``reduction="sum"`` and the LR divided by the
batch size: the updates stay what they were). Only a rise is read
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
"""The loss's and the gradient norm's shifts together (the sum of their z-scores over √2,
each in standard errors of the difference of two window medians, from the series' own
step-to-step noise) stand this far out: two independent measurements of one event."""
LOSS_Z = 2.0
"""... the loss's alone at least this (it did rise, beyond its noise) ..."""
GRAD_Z = 3.0
"""... and the gradient norm's at least this. A clean loss (z ≥ 5 alone) passes whenever its
gradient norm corroborates at 3; a classifier's loss, noisy per batch, needs the gradient
norm's clearer shift."""
LOGGED_MIN = 10.0
"""The loss alone stepping up by at least this factor, NOISE_Z standard errors on its own, at one
step and for good, while the gradient norm moves by less than half the smallest rescale (x1.22),
is the value handed to the recorder changing scale, not what the optimizer follows (``(loss *
1024).backward()`` with the gradients unscaled by hand and the scaled loss logged; percent
instead of a fraction; a sum over tokens). Training goes on as before; what follows is judged on
the new scale. Why an order of magnitude: a loss and its gradients are coupled (near a minimum
the excess loss goes as the gradient's square), so training that got worse moves the gradient
norm too, but a loss with a high floor (noisy labels) can rise x2 while its gradient moves
inside its noise; no training event moves the loss tenfold in one step and leaves the gradients
where they were. The held-out logged changes were x64 to x65536 (a loss scale, a sum over tokens
or the batch, percent); smaller loss-only steps stay the divergence rules'."""
MIN_POINTS = 40
OFF_SHARE = 0.2
"""A rescale multiplies every tensor's gradient by one factor; more than this share of the
tensors (and at least two) changing by another one is something else: targets or inputs in
new units, weights reloaded at another scale (the loss and gradient factors of such runs
agree as often as not). Measured at a shift's step: rescaled objectives — every matrix
``loss_x2`` run (45, 6-44 tensors), a loss x8 and a mean-to-sum change — ≤ 0.07 of the
tensors off; targets x1000, normalisation dropped, int8 weights without their scale,
weight_hh x3 — 0.33-1.0 off."""


def one_factor(per_tensor: list[tuple[np.ndarray, np.ndarray]]) -> bool | None:
    """Did every tensor's gradient norm change by one factor? ``per_tensor``: each tensor's
    finite positive norms over the ``w`` points before a shift and after it. A tensor is off
    when its change (of log medians) stands more than 3 standard errors of its own noise, and
    more than half the smallest rescale looked for, from the tensors' median change. None
    when fewer than two tensors have 4 points on each side (nothing to tell)."""
    d, se = [], []
    for before, after in per_tensor:
        if len(before) < 4 or len(after) < 4:
            continue
        lb, la = np.log(before), np.log(after)
        d.append(_med(la) - _med(lb))
        se.append(1.25 * float(np.hypot(_sigma(lb) / np.sqrt(len(lb)),
                                         _sigma(la) / np.sqrt(len(la)))))
    if len(d) < 2:
        return None
    dev = np.abs(np.asarray(d) - np.median(d))
    off = int((dev > np.maximum(3 * np.asarray(se), np.log(MIN_FACTOR) / 2)).sum())
    return not (off >= 2 and off > OFF_SHARE * len(d))


@dataclass(frozen=True)
class Shift:
    index: int
    """Position in the series of the first rescaled step."""
    step: int
    factor: float
    """The loss's factor (after / before)."""
    grad_factor: float
    span: tuple[int, int] = (0, 0)
    """First and last step of the windows compared (w valid points either side)."""
    logged: bool = False
    """The loss alone changed (the gradients stayed where they were): the value recorded
    changed scale, not what the optimizer follows (grad_factor is then 1)."""

    def text(self) -> str:
        if self.logged:
            return (f"the recorded loss changed ×{self.factor:.3g} at step {self.step} and "
                    "stayed there, while the gradient norm did not move")
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
    rg = lg - gg
    se_l, se_g, se_r = (1.25 * _sigma(x) * np.sqrt(2 / w) for x in (lg, gg, rg))
    best: tuple[float, int, float, float] | None = None
    for i in range(2 * w, n - 2 * w + 1):  # (a level held before it, and after)
        dl = _med(lg[i:i + w]) - _med(lg[i - w:i])
        # upward only: loss and gradients that fall together at one step are what a model
        # finding the solution looks like (a learning transition), and dividing what
        # follows by that factor would turn it into a divergence
        if dl < np.log(MIN_FACTOR) or dl < LOSS_Z * se_l:
            continue
        dg = _med(gg[i:i + w]) - _med(gg[i - w:i])
        # or the loss alone moved, conclusively (NOISE_Z by itself), while the gradient norm
        # stayed within half the smallest rescale looked for: the value recorded changed
        # scale (a loss scale applied before logging, other units, a sum), not what the
        # gradients come from (LOGGED_MIN)
        with np.errstate(divide="ignore", invalid="ignore"):
            alone = dl >= max(NOISE_Z * se_l, np.log(LOGGED_MIN)) and \
                abs(dg) < np.log(MIN_FACTOR) / 2
        # the gradient norm corroborates: shifted the same way at the same step,
        # significantly (3 standard errors). (Not by the same factor: when one term of a
        # sum is rescaled, the loss and the gradient change by different factors.)
        if not alone and (dg * dl <= 0 or abs(dg) < max(GRAD_Z * se_g,
                                                        np.log(MIN_FACTOR) / 2)):
            continue
        # two measurements of one event: together NOISE_Z standard errors (a noisy
        # classifier's loss, ±70% per batch, shows a x2 at 3 standard errors, its gradient
        # norm at 6)
        # (a noiseless series: its standard error 0, any shift is beyond it)
        with np.errstate(divide="ignore", invalid="ignore"):
            z = (dl / se_l + abs(dg) / se_g) / np.sqrt(2)
        if z < NOISE_Z and not alone:
            continue
        # A loss not conclusive alone leans on the gradient norm, which must then tell the
        # same story: a rescale multiplies the loss and every gradient by one k, so the
        # ratio of the two at each step (log loss − log gradient norm) does not move, and
        # its noise is far smaller than either's (a hard batch raises both). A constant-LR
        # classifier turning unstable lifts its loss x3 and its gradient norm x1.8 at once:
        # the ratio moves by 3 standard errors; a x2 rescale's by under 2.
        if dl < NOISE_Z * se_l and abs(_med(rg[i:i + w]) - _med(rg[i - w:i])) > 2 * se_r:
            continue  # (never ``alone``: that one is conclusive by itself)
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
            best = (abs(dl), i, dl, dg, alone)
    if best is None:
        return None
    _, i, dl, dg, alone = best
    i = _exact(lg, gg, i, w, se_l, 1e12 if alone else se_g)
    # the value recorded changes at one step, from one level to the other: the step before
    # at the old level, the step itself at the new one (each within 3 of a point's noise,
    # or a tenth of the change); a loss that climbs over steps to a worse level is no
    # rescale of what was logged (a model losing what it knew)
    tol = max(3 * _sigma(lg), abs(dl) / 10)
    if alone and not (abs(lg[i] - _med(lg[i:i + w])) <= tol
                      and abs(lg[i - 1] - _med(lg[i - w:i])) <= tol):
        return None
    # at the new level from its first step, the loss and the gradient norm alike: a step
    # that overshoots the level that follows by more than the shift itself and far beyond
    # one point's noise (the gradient x1000 where it then holds x8) is a batch that threw
    # the run, and what follows is the model knocked back, not a rescale
    for series, d, se in ((lg, dl, se_l), (gg, dg, se_g)):
        over = series[i] - _med(series[i - w:i]) - d
        if over > max(abs(d), 4 * se * np.sqrt(w / 2) / 1.25):
            return None
    return Shift(int(idx[i]), int(step[idx[i]]), float(np.exp(dl)),
                 1.0 if alone else float(np.exp(dg)),
                 (int(step[idx[max(0, i - w)]]), int(step[idx[min(n - 1, i + w - 1)]])),
                 logged=bool(alone))


def _exact(lg: np.ndarray, gg: np.ndarray, i: int, w: int, se_l: float, se_g: float) -> int:
    """The step of the change near ``i``: the split of [i − w, i + w) between the two levels
    (the window medians around ``i``) with the least absolute error, the loss's and the
    gradient norm's, each in units of its own noise (two measurements of one step; a noisy
    classifier's loss alone dates it a few steps off). Window medians hardly move while the
    change is inside either window: the split does."""
    lo, hi = max(w // 2, i - w // 2), min(len(lg) - w // 2, i + w // 2 + 1)
    js = range(max(lo, i - w + 1), min(hi, i + w))
    costs = np.zeros(len(js))
    for x, se in ((lg, se_l), (gg, se_g)):
        a, b = _med(x[i - w:i]), _med(x[i:i + w])
        seg = x[i - w:i + w]
        costs += np.array([np.abs(seg[:j - (i - w)] - a).sum()
                           + np.abs(seg[j - (i - w):] - b).sum() for j in js]) / max(se, 1e-12)
    return js[0] + int(np.argmin(costs)) if len(js) else i

