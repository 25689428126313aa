"""loss_divergence: the smoothed loss climbs well above its best level and stays there."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...stats import robust as _stats
from ...stats.onset import departure
from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _changes, _data, _weights, loss_spike
from .base import Context

ID = "loss_divergence"
NEEDS: tuple[str, ...] = ("loss",)
MAX_POINTS = 2000
DEFAULTS: dict[str, Any] = {
    "smooth_frac": 0.02,   # rolling-median window as a share of the steps ...
    "smooth_min": 5,       # ... at least this many steps
    "rise": 0.3,           # final level − best > rise × (start − best): it gave back a third
                           # of what it had learned (a healthy run ends near its best; 0.5
                           # missed ViT/CNN runs whose LR ramp undid 40% of their progress) ...
    "rise_abs": 0.02,      # ... and > rise_abs × |best| ...
    "noise_sigmas": 1.5,   # ... and the end (a median of tail steps) > this many σ of the
                           # loss's step-to-step noise above the best tail/2-step median
    "tail_frac": 0.1,      # "final level" = median of the last tail_frac of the steps
    "blowup": 0.25,        # never recovered: from step 0 the smoothed loss climbs over this
                           # share of |step-0 loss| above it (at initialisation a model's loss
                           # is an uninformed guess's; a quarter above it is a model made
                           # worse than knowing nothing) and the end is still above step 0's
    "blowup_sigmas": 4.0,  # ... and the climb is over this many σ of the loss's step-to-step
                           # noise: step 0 is one draw. Measured on losses that never moved
                           # (chi-square and lognormal per-step noise, 120-1,000 steps, 300
                           # seeds each): at most 3.8σ unless the tails are extreme (a
                           # one-sample squared error); the GRU LM at LR ×100 climbs 4.8-7.5σ
    "min_steps": 20,
}
DOC = {
    "meaning": "Training diverges: after reaching its best, the loss rises and stays high "
               "(or turns NaN).",
    "rule": "the loss at the end (the median of its last tail_frac of steps) exceeds its "
            "best level measured at the same precision (the lowest median of as many "
            "consecutive steps: a narrower window's minimum is an extreme of the noise) by "
            "more than rise × (start − best), rise_abs × |best| and noise_sigmas × the "
            "loss's step-to-step noise (a level shift: the loss may spike and then settle "
            "at its new, worse level; the noise is measured up to the best point, as a "
            "diverging loss is turbulent itself). A loss that turns nonfinite without "
            "rising first is the nonfinite finding's. A learning-rate jump just before the "
            "onset is named as its cause. Onset: where the smoothed loss leaves its best "
            "level for good by a tenth of the rise, or by two sigmas of the loss's step noise "
            "(up to its best, or in a smoothing window either side of its best, the larger) "
            "where that is more (at most half the rise: a bar inside the noise is crossed "
            "by noise); a batch that threw the run (loss_spike) "
            "before the loss had risen half way dates it. Also a loss that never recovered: "
            "in a run "
            "recorded from step 0, the smoothed loss climbs more than blowup × |step-0 "
            "loss| and blowup_sigmas × the loss's step-to-step noise above the step-0 loss "
            "in the first half of the run, and the end is still above the step-0 loss (its "
            "best is then its start, hidden from the rule above by the smoothing of the "
            "first window; step 0 is one draw, hence the noise margin). A rescaled "
            "objective (stats/shift.py: the loss and the gradient norm step up together "
            "and stay, ≥ ×1.5, together 5 standard errors of their window medians, the "
            "loss at least 2 and the gradient norm 3; a loss under 5 alone also keeps its "
            "ratio to the gradient norm within 2; where per-tensor gradient norms were "
            "recorded, no more than one tensor or 20% of them moved by another factor than "
            "the others': targets, inputs or weights at a new scale are no rescale) is "
            "reported at info and the steps after "
            "it are judged on its new scale (an LR that rose into that step explains it "
            "instead; one that fell is the loop compensating a rescale; at the first batch "
            "of a new input shape, where those are rare, the data changed; and the loss "
            "alone stepping up LOGGED_MIN = 10x or more at one step and for good, NOISE_Z "
            "standard errors on its own, while the gradient norm moves less than x1.22, is "
            "the value recorded changing scale — a loss scale logged, other units; why 10x: "
            "loss and gradient are coupled, no training event moves the loss tenfold in one "
            "step and leaves the gradients, while a loss with a high floor can rise x2 "
            "inside its gradient's noise: stats/shift.LOGGED_MIN) — unless a "
            "classifier that had learned (loss under half of ln C) settled at its chance "
            "level after it (0.9–1.25 ln C over the two windows after the first one past "
            "the jump): a model knocked back to "
            "guessing, judged as it is. A rise that began while a scheduled ramp rose "
            "(_weights.py: a logged metric that never decreases, ramps smoothly ×2 or from "
            "0 and is neither a counter nor the LR: a loss term's weight phased in, a "
            "harder curriculum, pruning) is the loop's design, at info; the steps after the "
            "ramp settled are judged on their own.",
    "fixes": "Lower the learning rate (often 3–10×), add warm-up, clip gradients, check the "
             "LR schedule, use bf16/loss scaling, normalise inputs.",
}


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    r = _data.primary_rank(ctx, "loss")
    if r is None:
        return []
    shift = _data.objective_shifts(ctx).get(r)
    return ([_rescaled(r, shift)] if shift is not None else []) + _reweighted(
        ctx, th, r, _detect(ctx, th, r))


def _reweighted(ctx: Context, th: Thresholds, r: int, found: list[Finding]) -> list[Finding]:
    """A divergence whose rise began while a scheduled ramp rose (_weights.py: a loss
    term's weight phased in, a harder curriculum) is the loop's design, at info; the steps
    after the ramp settled are judged on their own (a divergence there is one)."""
    out = []
    for f in found:
        w = _weights.over(ctx, int(f.first_step)) if f.severity == "error" else None
        if w is None:
            out.append(f)
            continue
        after = _detect(ctx, th, r, since=w["end"]) if w["end"] is not None else []
        if after:
            out += after
            continue
        settled = (f" After it settled the loss {_trend_after(ctx, r, w['end'])}."
                   if w["end"] is not None else " It was still rising at the end.")
        out.append(Finding(
            id=ID, severity="info", subject="loss", first_step=f.first_step,
            title=f"The loss rose with a scheduled ramp (`{w['name']}`)",
            message=(f"The loss rose from step {f.first_step} while {_weights.text(w)}: a "
                     "quantity the loop raises on a schedule (a loss term's weight phased "
                     "in, a harder curriculum, pruning), so the loss before and after it "
                     f"measures different things.{settled}"),
            advice="Nothing to fix if the ramp is meant; log each term of the loss as its "
                   "own metric (rec.step(loss=..., task=..., aux=...)) to follow each.",
            chart=anchors.LOSS,
            evidence={**f.evidence, "weight": w}))
    return out


def _trend_after(ctx: Context, r: int, since: int) -> str:
    """"fell from 0.78 to 0.67" over the steps from ``since`` (window medians)."""
    d = _data.steps(ctx)[r]
    y = d["loss"][(d["step"] >= since) & np.isfinite(d["loss"])]
    if not len(y):
        return "held"
    k = max(1, len(y) // 10)
    a, b = float(np.median(y[:k])), float(np.median(y[-k:]))
    return f"{'fell' if b < a else 'held'} from {a:.4g} to {b:.4g}"


def _rescaled(r: int, sh: Any) -> Finding:
    """The objective changed scale at one step (stats/shift.py): what it is, at info."""
    if getattr(sh, "logged", False):
        return Finding(
            id=ID, severity="info", subject="loss", first_step=sh.step,
            title=f"The recorded loss changed scale ×{sh.factor:.3g} at step {sh.step}",
            message=(f"{sh.text()[:1].upper()}{sh.text()[1:]}: what the optimizer "
                     "follows did not change scale, the value recorded did (a loss scale "
                     "or other units applied before logging, a sum instead of a mean, or a "
                     "term added whose gradients are small next to the others'). Training "
                     "goes on as before; the loss after it is judged on its new scale."),
            advice="If it was not meant, log the loss the gradients come from (divide a "
                   "manual loss scale out before rec.step(loss=...)); log an added term as "
                   "its own metric (rec.step(loss=..., aux=...)) to follow each.",
            chart=anchors.LOSS,
            evidence={"rank": r, "step": sh.step, "loss_factor": sh.factor,
                      "grad_factor": sh.grad_factor, "logged": True})
    return Finding(
        id=ID, severity="info", subject="loss", first_step=sh.step,
        title=f"The objective was rescaled ×{sh.factor:.3g} at step {sh.step}",
        message=(f"At step {sh.step} {sh.text()}: every gradient scaled with the loss, so "
                 "the objective itself changed (a loss weight, a term counted twice, a sum "
                 "instead of a mean), not the training. The loss after it is judged on its "
                 "new scale."),
        advice="If the change was not meant, look at what the loss code does from that "
               "step (an auxiliary term switched on, a refactor). Under SGD it multiplies "
               "the effective learning rate for good; under Adam for a while (its step "
               "follows the loss's scale until the second moment catches up, ~1/(1−β2) "
               "steps, 1,000 by default), then the scale cancels.",
        chart=anchors.LOSS,
        evidence={"rank": r, "step": sh.step, "loss_factor": sh.factor,
                  "grad_factor": sh.grad_factor})


def _detect(ctx: Context, th: Thresholds, r: int, since: int | None = None
            ) -> list[Finding]:
    """The divergence of rank ``r``'s loss, over the steps from ``since`` when given."""
    d = _data.steps(ctx)[r]
    step_all, loss_all = d["step"], d["loss"]
    has = d["loss_given"]
    if since is not None:
        keep = step_all >= since
        step_all, loss_all, has = step_all[keep], loss_all[keep], has[keep]
    finite = np.isfinite(loss_all)
    if finite.sum() < th.min_steps:
        return []
    # a loss that ends nonfinite has diverged; use the finite prefix for the shape
    tail_nonfinite = bool(has.any() and not finite[np.flatnonzero(has)[-1]])
    step, loss = step_all[finite], loss_all[finite]
    # the loss of the model at initialisation: step 0's own, before any bucketing (a resumed
    # run's first loss is not)
    init = float(loss[0]) if int(step[0]) == 0 else None
    step_noise = _stats.mad_sigma(np.diff(loss)) / np.sqrt(2.0)  # (one raw step's σ)
    if len(loss) > MAX_POINTS:
        # long runs: window medians first (the shape is what matters; keeps this O(n))
        x, y = _stats.bucket_series(step.astype(np.float64), loss, MAX_POINTS, how="median")
        step, loss = x.astype(np.int64), y
    w = max(int(th.smooth_min), int(len(loss) * float(th.smooth_frac)))
    sm = _stats.rolling_median(loss, w)
    ib = int(np.nanargmin(sm))
    best = float(sm[ib])
    start = float(np.median(sm[: max(1, w)]))
    tail = max(w, int(len(loss) * float(th.tail_frac)))
    end = float(np.median(loss[-tail:]))
    ref = max(start - best, 1e-12)
    after = sm[ib:]
    # The end of the *finite* loss must have risen: a loss that jumps straight from a
    # healthy level to NaN is the nonfinite finding's (its noise before the NaN is not a
    # divergence).
    # Levels compared at the same precision: the end is a median of `tail` steps, so the
    # best level it is compared with is the lowest median of `tail` consecutive steps. The
    # minimum of a narrower rolling median is an extreme value of the noise itself: on a
    # noisy per-batch loss (a classifier on batches of 32, σ 0.07 at a level of 0.4) the
    # lowest 6-step median sat 0.08 below the lowest 30-step one, and a tail of harder
    # batches read as "gave back a third of what it learned".
    # Significance against the loss's own step noise as well (the noise of the loss up to
    # its best: a diverging loss is turbulent itself, and its own turbulence must not hide
    # the rise).
    upto = loss[:ib + w] if ib + w >= 10 else loss
    noise = _stats.mad_sigma(np.diff(upto)) / np.sqrt(2.0)
    # (whole windows only: a centred rolling median's shrunken edges are narrower medians)
    best_level = float(np.min(np.median(np.lib.stride_tricks.sliding_window_view(
        loss, min(tail, len(loss))), axis=1)))
    gain = end - best_level
    rose = (gain > th.rise * max(start - best_level, 1e-12)
            and gain > th.rise_abs * abs(best_level)
            and gain > th.noise_sigmas * noise and ib < len(sm) - tail)
    # a loss whose smoothed minimum is not below its very first value never fell at all:
    # the edge of the smoothing window only made it look as if it had (a loss growing 10x a
    # step from step 0 "fell from 172 to 13.9")
    if not rose or (init is not None and init <= best):
        return _never_recovered(ctx, th, r, step, loss, sm, end, tail_nonfinite,
                                l0=init, noise=step_noise)
    level = end if not tail_nonfinite else float("inf")
    # onset: the first raw loss after the best that leaves the best level by a tenth of
    # the rise, and the smoothed loss stays above that from there; the bar sits at least
    # two step-noise sigmas above the best level (up to half the rise): a bar inside the
    # noise is crossed by noise, and a noisy loss that jumps to a new level was dated
    # twenty steps before its jump (BERT whose units died at 150: "rose from step 131").
    # The noise is the larger of the loss's up to its best and around its best (a window
    # either side: the level the departure leaves, before any turbulence of the rise): a
    # loss learnt smoothly is noisier at its best
    near = loss[max(0, ib - w):ib + w + 1]
    local = _stats.mad_sigma(np.diff(near)) / np.sqrt(2.0) if len(near) >= 10 else 0.0
    onset_level = best + max(0.1 * min(end - best, 10 * max(ref, abs(best))),
                             min(2 * max(noise, local), 0.5 * (end - best)))
    first = int(step[min(departure(loss, sm, ib, onset_level, w), len(step) - 1)])
    how = f"ends at {end:.4g}" + (" and then turned nonfinite" if tail_nonfinite else "")
    # the rise is clear where the smoothed loss first reaches (nine tenths of the way to)
    # its final level: the jump that caused it comes before that
    reach = np.flatnonzero(after >= end - 0.1 * (end - best))
    clear = int(step[ib + int(reach[0])]) if len(reach) else first
    # a divergence that had not risen half way before a batch threw the run began with the
    # batch (bad batch -> spike -> divergence; gradient_explosion dates its growth alike)
    thrown = loss_spike.batch_span(ctx)
    if thrown is not None and first < thrown[0] <= clear:
        pre = loss[(step >= first) & (step < thrown[0])]
        if not len(pre) or float(np.median(pre)) < best_level + 0.5 * (end - best_level):
            first = thrown[0]
    cause = _changes.within(ctx, min(first, clear) - 10, max(first, clear) + 2)
    first, because = _changes.dated_by(cause, first)
    return [Finding(
        id=ID, severity="error", subject="loss", first_step=first,
        title="Loss diverges" + ({"lr": " after a learning-rate jump",
                                  "lr_ramp": " as the learning rate rises"}.get(
                                      cause["kind"], f" after step {cause['step']}")
                                 if cause else ""),
        message=(f"The loss fell from {start:.4g} to {best:.4g} (step {int(step[ib])}), then "
                 f"rose from step {first}{because}, and {how}."
                 + ("" if cause else _changes.early_lr_note(ctx, first))),
        advice=DOC["fixes"], chart=anchors.LOSS,
        evidence={"best_loss": best, "best_step": int(step[ib]), "start_loss": start,
                  "end_loss": level, "rise": end - best, "loss_noise": noise, "rank": r,
                  "ended_nonfinite": tail_nonfinite, "cause": cause})]


def _never_recovered(ctx: Context, th: Thresholds, r: int, step: np.ndarray,
                     loss: np.ndarray, sm: np.ndarray, end: float, tail_nonfinite: bool, *,
                     l0: float | None, noise: float) -> list[Finding]:
    """The loss rose from its very first step and never came back below it (a learning rate
    too high from the start: the model is left worse than at initialisation). ``l0``: step
    0's loss (None for a run not recorded from step 0); ``noise``: one raw step's σ (a long
    run's ``loss`` is bucket medians, whose own steps are far less noisy than step 0, a
    single draw)."""
    if l0 is None:
        return []
    half = sm[: max(1, len(sm) // 2)]
    ip = int(np.nanargmax(half))
    peak = float(half[ip])
    # (a loss that climbs orders of magnitude into NaN/Inf needs no noise margin: its own
    # step-to-step "noise" is the blow-up)
    clear = peak - l0 > th.blowup_sigmas * noise or (tail_nonfinite and peak > 10 * abs(l0))
    if not (peak - l0 > float(th.blowup) * abs(l0) and clear and (end > l0 or tail_nonfinite)):
        return []
    # onset: the earlier of where the loss first went a tenth of the way to its peak (late
    # for a geometric rise, whose peak is orders above) and where it stayed above its start
    # by its noise up to the peak (late for a noisy blow-up that dips back now and then)
    tenth = np.flatnonzero((loss > l0 + 0.1 * (peak - l0)) & (step > 0))
    margin = min(th.blowup_sigmas * noise, float(th.blowup) * abs(l0))
    below = np.flatnonzero((loss[:ip + 1] <= l0 + margin) & (step[:ip + 1] > 0))
    stayed = np.flatnonzero(step[:ip + 1] > (step[below[-1]] if len(below) else 0))
    cands = [int(step[int(a[0])]) for a in (tenth, stayed) if len(a)]
    first = min(cands) if cands else int(step[ip])
    cause = _changes.within(ctx, first - 10, first + 2)
    first, because = _changes.dated_by(cause, first)
    how = f"ends at {end:.4g}" + (" and then turned nonfinite" if tail_nonfinite else "")
    return [Finding(
        id=ID, severity="error", subject="loss", first_step=first,
        title="Loss rose from the start and never recovered",
        message=(f"The loss rose from {l0:.4g} at step 0 to {peak:.4g} (step {int(step[ip])}) "
                 f"from step {first}{because}, and never came back below where it started: "
                 f"it {how}. Training left the model worse than at initialisation."
                 + ("" if cause else _changes.early_lr_note(ctx, first))),
        advice=DOC["fixes"], chart=anchors.LOSS,
        evidence={"best_loss": l0, "best_step": 0, "start_loss": l0,
                  "end_loss": end if not tail_nonfinite else float("inf"),
                  "peak_loss": peak, "rise": end - l0, "never_recovered": True, "rank": r,
                  "ended_nonfinite": tail_nonfinite, "cause": cause})]
