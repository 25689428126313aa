"""loss_plateau: the loss has not decreased significantly over a window (cf. SageMaker
Debugger's LossNotDecreasing). A plateau covering most of the run means it never learned
(warning); a late plateau after real progress is normal convergence (info)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...stats import robust as _stats
from ...stats.onset import settle
from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _changes, _data, _weights, loss_spike
from ._structure import chance_level
from .base import Context

ID = "loss_plateau"
NEEDS: tuple[str, ...] = ("loss",)
DEFAULTS: dict[str, Any] = {
    "min_steps": 50,            # need at least this many loss values
    "window_frac": 0.2,         # a plateau lasts at least this share of the run ...
    "window_min": 30,           # ... and at least this many steps
    "min_rel_decrease": 0.01,   # decrease < 1% of the loss level counts as "not decreasing"
    "max_p": 0.01,              # ... unless a Mann–Kendall test says it falls significantly
    "warn_frac": 0.8,           # plateau over ≥ this share of the run → warning, else info
    "flat_band": 0.05,          # a plateau's window medians stay within this share of its level
    "stall_frac": 0.6,          # or over ≥ this share when the loss fell by less than
    "stall_drop": 0.2,          # this share of its starting level before it (stalled early)
    "points": 200,              # the series is reduced to this many window medians
}
DOC = {
    "meaning": "The loss stopped decreasing (or never did).",
    "rule": "the longest tail of the run where the loss (window medians) fell by less than "
            "min_rel_decrease of its level, or did not fall significantly (Mann–Kendall "
            "p ≥ max_p); warning when it covers ≥ warn_frac of the run and the whole run did "
            "not decrease either, or covers ≥ stall_frac after the loss fell by less than "
            "stall_drop before it (stalled early), else info. A warning plateau at ln C, for "
            "the C of the model's logits (within CHANCE_TOL) or a small integer C ≤ 10 "
            "(within SMALL_K_TOL), is named chance level. A batch that threw the run "
            "(loss_spike's batch event) is a setback, not part of a plateau: the tails are "
            "judged on either side of it (one plateau when the loss sat at one level on "
            "both sides, else the one after it, which the batch explains); so is a rescaled "
            "objective's step (stats/shift.py). The steps of the "
            "loop's periodic structure (loss_spike's pattern: a second task every N steps) "
            "are left out: the trend is the other steps'. A loss under a scheduled ramp "
            "(_weights.py: a term's weight phased in, a harder curriculum) is judged on the "
            "steps after it settled, not at all while it still ramps at the end. A plateau "
            "that a finding above info explains (causality.py: a batch that threw the run, "
            "dead units, an optimizer that does not hold the parameters) is a warning: the "
            "run stopped learning because of it, it did not converge.",
    "fixes": "If it never decreased: check that the optimizer holds the model's parameters, "
             "that lr > 0 and gradients flow (requires_grad, detach), labels match inputs. If "
             "it stalled late: LR decay/schedule, a larger model, or stop early.",
}


def _decreasing(y: np.ndarray, th: Thresholds) -> bool:
    """Does the reduced series y fall meaningfully and significantly?"""
    k = max(1, len(y) // 5)
    drop = float(np.median(y[:k]) - np.median(y[-k:]))
    level = max(float(np.median(np.abs(y))), 1e-12)
    if drop < th.min_rel_decrease * level:
        return False
    z, p = _stats.mann_kendall(y)
    return z < 0 and p < th.max_p


def _climbs(y: np.ndarray, th: Thresholds) -> bool:
    """Does the reduced series rise meaningfully and significantly? Then it is not a
    plateau: it diverges (loss_divergence's job), and a span that holds both the learning
    and the divergence is neither."""
    k = max(1, len(y) // 5)
    rise = float(np.max(y[k:]) if len(y) > k else y[-1]) - float(np.median(y[:k]))
    level = max(float(np.median(np.abs(y))), 1e-12)
    if rise < th.min_rel_decrease * level * 10:
        return False
    z, p = _stats.mann_kendall(y)
    return z > 0 and p < th.max_p


def _flat(y: np.ndarray, th: Thresholds) -> bool:
    """Does the reduced series stay within a narrow band (the medians of its five
    consecutive blocks within flat_band of its level plus 4x the noise of consecutive window
    medians)? A span that holds both progress and a setback is not a plateau, even if it
    ends where it began."""
    blocks = [float(np.median(b)) for b in np.array_split(y, min(5, len(y))) if len(b)]
    level = max(float(np.median(np.abs(y))), 1e-12)
    noise = _stats.mad_sigma(np.diff(y)) / np.sqrt(2.0)
    band = th.flat_band * level + 4 * noise
    # and it starts at that level (not on the way there)
    head = float(np.median(y[:max(3, len(y) // 20)]))
    return max(blocks) - min(blocks) <= band and abs(head - float(np.median(y))) <= band


def _start(x: np.ndarray, y: np.ndarray, min_len: float, th: Thresholds) -> int | None:
    """Index where the plateau of the reduced series (x, y) begins: the longest tail at least
    ``min_len`` steps long that neither decreases nor climbs and stays flat, from where the
    loss settled into its band; None when there is none."""
    npts = len(x)
    # smallest start index i whose tail [i:] is long enough and not decreasing
    plateau_i = None
    for i in range(npts):
        if x[-1] - x[i] < min_len or npts - i < 6:
            break
        if not _decreasing(y[i:], th) and not _climbs(y[i:], th) and _flat(y[i:], th):
            plateau_i = i
            break
    if plateau_i is None:
        return None
    # dated where the loss settled into the plateau's band, not where the tail that is no
    # longer falling begins (a fall in the first steps before a long flat stretch is part
    # of that tail, but the plateau starts where it ends)
    return settle(y, plateau_i, float(th.flat_band))


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    series = _data.finite_loss(ctx, int(th.min_steps))
    if series is None:
        return []
    r, step, loss = series
    span = float(step[-1] - step[0]) or 1.0  # (the run's, whatever part of it is judged)
    # a loss under a scheduled ramp (_weights.py: a term's weight phased in, a curriculum) is
    # comparable only at the final weight: the plateau is judged on the steps after the
    # last ramp settled, and not at all while one is still rising at the end
    settled, rising = _weights.last_end(ctx)
    if rising:
        return []
    if settled is not None:
        keep = step >= settled["end"]
        if keep.sum() < int(th.min_steps):
            return []
        step, loss = step[keep], loss[keep]
    # the loop's structure by design (a second task every 4th step) is not the trend: the
    # plateau is judged on the steps it does not explain, the main task's loss
    pattern = loss_spike.loop_pattern(ctx)
    if pattern is not None:
        keep = ~np.isin(step % pattern.period, pattern.phases)
        if keep.sum() >= int(th.min_steps):
            step, loss = step[keep], loss[keep]
        else:
            pattern = None
    x, y = _stats.bucket_series(step.astype(np.float64), loss, int(th.points), how="median")
    min_len = max(float(th.window_frac) * span, float(th.window_min))
    # A batch that threw the run (loss_spike's batch event) is a setback at one step: a
    # plateau is judged on either side of it, never across it (a tail holding the learning
    # before it and the flat loss it left behind is "not decreasing" only because it was
    # thrown back). A plateau on both sides at one level is one plateau that the batch
    # interrupted; one after it only is the batch's consequence (causality.py).
    plateau_i = _start(x, y, min_len, th)
    thrown = loss_spike.batch_span(ctx)
    shift = _data.objective_shifts(ctx).get(r)
    if thrown is None and shift is not None:
        # a rescaled objective is a break of the same kind: the levels on either side are
        # compared only through the factor's estimate (a few % off) and the optimizer's
        # response to it (Adam's second moment adapts over ~1/(1-β2) steps, so the step size
        # is ×k for hundreds of steps), so each side's trend is judged on its own
        thrown = (int(shift.step), int(shift.step))
    if thrown is not None:
        pre, post = np.flatnonzero(x < thrown[0]), np.flatnonzero(x > thrown[1])
        after = _start(x[post], y[post], min_len, th) if len(post) else None
        before = _start(x[pre], y[pre], min_len, th) if len(pre) else None
        plateau_i = None if after is None else int(post[after])
        if after == 0 and before is not None and _flat(
                np.concatenate([y[pre][before:], y[post]]), th):
            plateau_i = int(pre[before])
    if plateau_i is None:
        return []
    first = int(x[plateau_i])
    frac = (step[-1] - first) / span
    # "Never learned" needs the run as a whole not to have decreased either: a model that
    # converges quickly (loss down 99% in the first 15% of the steps) and then sits at its
    # noise floor has a long plateau too, but that is normal convergence.
    # It stalled early when, before the plateau, it fell by less than stall_drop of its
    # starting level (an LM stuck at its unigram loss; a quickly converged classifier
    # instead drops ~99% before its plateau).
    k = max(1, len(y) // 20)
    start_level = float(np.median(y[:k]))
    drop = (start_level - float(np.median(y[plateau_i:]))) / max(abs(start_level), 1e-12)
    sev = "warning" if (frac >= th.warn_frac and not _decreasing(y, th)) or (
        frac >= th.stall_frac and drop < th.stall_drop) else "info"
    level = float(np.median(y[plateau_i:]))
    never = sev == "warning"
    title = "Loss is not decreasing" if never else "Loss has plateaued"
    lr = _changes.lr_summary(ctx)
    lr_note = ""
    decayed = _changes.lr_decayed(ctx, first)
    if decayed is not None:
        lr_note = f" {decayed['text']}: the schedule, not the model, stopped the learning."
    elif never and lr is not None:
        at = _lr_during(ctx, first)
        how = " throughout" if lr["constant"] else f" at first (max {lr['max']:.3g})"
        if not lr["constant"] and at is not None and not math.isclose(
                at[0], lr["first"], rel_tol=1e-6):
            how += f", {at[0]:.3g} when the plateau began"
        lr_note = (f" The learning rate was {lr['first']:.3g}{how}: if the loss fell in the "
                   "first steps and stalled, it is likely too high; if it never moved, too "
                   "low (or the gradients do not flow).")
        if at is not None and at[1] < at[0] / 10:
            lr_note += (f" The schedule then cut it to {at[1]:.3g} (×{at[1] / at[0]:.2g}) "
                        "while the loss sat on this level: a decay before the model learned "
                        "keeps it there.")
    # (a loss under a scheduled ramp is no plain cross-entropy: no chance level reads it)
    chance = chance_level(ctx, level) if never and settled is None else None
    if chance is not None:
        title = "Loss stuck at chance level"
        lr_note = (f" It sits at ln({chance}) = {math.log(chance):.4g}, the cross-entropy of "
                   f"a uniform guess over {chance} classes: the model predicts at chance level. "
                   "Check that labels match their inputs (a shuffled or misaligned label "
                   "list), that the data is shuffled, and that the loss gets logits (not "
                   "probabilities or detached outputs).") + lr_note
    return [Finding(
        id=ID, severity=sev, subject="loss", first_step=first, title=title,
        message=(f"From step {first} to {int(step[-1])} ({100 * frac:.0f}% of the run) the "
                 f"loss stayed around {level:.4g} without a significant decrease (less than "
                 f"{100 * th.min_rel_decrease:.0f}% or not significant)."
                 + (f" (Judged on the steps outside the loop's structure, which repeats "
                    f"{pattern.text()}.)" if pattern is not None else "")
                 + (" The model does not seem to learn." if never and decayed is None
                    else "") + lr_note),
        advice=DOC["fixes"], chart=anchors.LOSS,
        evidence={"plateau_steps": int(step[-1] - first), "plateau_frac": float(frac),
                  "level": level, "rank": r, "lr": lr, "chance_classes": chance,
                  "lr_decayed": decayed})]


def _lr_during(ctx: Context, first: int) -> tuple[float, float] | None:
    """The learning rate (the run's primary rank's) at the plateau's first step and at the
    run's end: the advice quotes the rate the plateau had, not the run's first."""
    series = _data.finite_series(ctx, "lr")
    if series is None:
        return None
    _, step, lr = series
    i = min(int(np.searchsorted(step, first)), len(lr) - 1)
    return float(lr[i]), float(lr[-1])
