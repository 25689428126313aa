"""loss_spike: single steps whose loss jumps far above the local level (median/MAD)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...stats import robust as _stats
from ...stats.excursion import single_step
from ...stats.periodic import Pattern, one_phase, phase_level, phase_pattern
from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _batch, _changes, _data, _spike_tail
from ._batch import DOMINANT
from .base import Context

ID = "loss_spike"
NEEDS: tuple[str, ...] = ("loss",)
DEFAULTS: dict[str, Any] = {
    "window": 51,          # centred rolling-median window (steps) for the local level
    "z": 8.0,              # spike: loss − local median > z × robust σ of the residuals ...
    "min_rel_jump": 0.5,   # ... and > this × |local median| (ignores noise on tiny losses)
    "min_fall_frac": 0.05,  # ... and > this × how far the loss has fallen from its start
    "min_steps": 30,
    "error_count": 10,     # this many spikes → error instead of warning
    "recover_steps": 5,    # a spike comes back down: the median of the next steps ...
    "recover_frac": 0.5,   # ... is below level + this × the jump (else it is divergence)
}
DOC = {
    "meaning": "Individual steps where the loss jumps far above its local level.",
    "rule": "residual to a centred rolling median (window) exceeds z robust σ (1.4826·MAD of "
            "the residuals), min_rel_jump × the local level and min_fall_frac × how far the "
            "loss has fallen from its first half window's median (a converged loss is "
            "heavy-tailed per batch: one hard example in a batch of 32 at the starting loss "
            "moves the batch mean by ~3% of the start, so a bump that gives back under 5% of "
            "what training gained is ordinary), and the loss comes back down (median of the "
            "next recover_steps below level + recover_frac × jump; a loss that stays up is "
            "loss_divergence, not a spike), and the rise is one step's doing (one step of "
            "the climb into the excursion's top made at least half its height above the "
            "level — a batch makes all of its rise in one step, or half with the knocked "
            "model's next step; a climb slower than doubling each step never does: the top "
            "of a climb over many steps, an instability that corrects itself, is no batch; "
            "stats/excursion.SHARE). Spikes at a phase of a fixed "
            "period whose median over ≥ 4 cycles is itself a spike (a multi-task loop, "
            "a curriculum, an eval every N steps: stats/periodic.py), or a phase whose "
            "median log loss stands above the others' cycle after cycle (phase_level: a "
            "second task at 3x the loss under a CNN's per-batch noise), or spikes that all "
            "fall on one phase of a period "
            "(at least 4, chance under 1e-3, more than half of that phase's steps over their "
            "span: a round-robin task whose loss is far above the others' until it learns), "
            "are the loop's structure: explained, and "
            "reported at info when nothing else remains. Events are spikes and throws (a "
            "one-step jump of DOMINANT x min_rel_jump above the level from a step still at "
            "it, whether or not it came back: the model knocked back, or into NaN), one "
            "event while the loss has not fallen back, or while a knocked model flails (the "
            "loss above its level by half of it at every step between spikes at most 10 "
            "steps apart: _batch.KNOCKED_REL, KNOCKED_GAP); one DOMINANT (10x) beyond "
            "every other in its excess relative to the level before it, or the only one, "
            "is a batch that threw the run (evidence.batch; not within 10 steps after a "
            "learning-rate jump or during a rising ramp): the finding is dated at it and is the "
            "cause of the explosion, divergence, NaN or plateau that begins with it. A spike or "
            "throw counts only when it did damage (the lower quartile of the next "
            "2 × recover_steps losses stays four times what that floor wanders after any "
            "step above the level before it), or stands apart from the loss's own tail "
            "(between it and the largest step under the bar, the sorted sizes, relative to "
            "their level, break somewhere by APART = 5; the steps right after a spike are "
            "its consequences, not the tail), or comes with a learning-rate rise once a "
            "level is set (a jump just before, or a ramp that took the rate above the "
            "run's median); the others are the data's heavy tail (outlier targets, noisy "
            "labels in small batches, long sequences summed over tokens): reported at "
            "info (_spike_tail.py). An event that begins at the first batch of a new input "
            "shape (steps.new_shapes), in a run where at most RARE_SHAPES = 2% of the steps "
            "saw one (a corrupt batch lands on one by chance 2% of the time at most), is a "
            "new stage of the data (a length curriculum, a new source): "
            "explained, reported at info (_batch.py), still a setback other detectors do "
            "not read across.",
    "fixes": "Lower the learning rate or add warm-up, clip gradients, look for bad batches "
             "(the spike steps' data), use a larger batch or loss scaling with AMP.",
}


def level_before(loss: np.ndarray, h: int) -> np.ndarray:
    """The loss's level just before each step: the median of the previous ``h`` points (fewer
    near the start; NaN at the first step, which has nothing before it)."""
    before = np.lib.stride_tricks.sliding_window_view(
        np.concatenate([np.full(h, np.nan), loss.astype(np.float64)]), h)[:-1]
    return _stats.nanmedian(before, axis=1)


def find_spikes(step: np.ndarray, loss: np.ndarray, th: Thresholds
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, np.ndarray]:
    """(spike indices, local median, residual, σ, the level before each step) over the
    finite part of the series."""
    base = _stats.rolling_median(loss, int(th.window))
    resid = loss - base
    sigma = _stats.mad_sigma(resid)
    floor = float(th.min_rel_jump) * np.abs(base)
    # A spike is also a jump up from the level just before it (median of the previous half
    # window). Near the start the centred window is cut off: while the loss still falls fast
    # its median lies far below the first losses, which would otherwise all look like spikes
    # (the first step, with nothing before it, never is one).
    h = max(1, int(th.window) // 2)
    prev = level_before(loss, h)
    jump = loss - prev
    thr = th.z * max(sigma, 1e-12)
    # What training has gained so far: the fall from the first half window's level to the
    # level before this step (nothing where the loss has not fallen: fine-tuning from a
    # converged checkpoint, random labels). On a converged loss the per-batch tail grows
    # relative to the small level, so the relative floor alone passes ordinary hard batches.
    start = float(_stats.nanmedian(loss[:h], axis=0))
    with np.errstate(invalid="ignore"):
        gained = float(th.min_fall_frac) * np.maximum(start - prev, 0.0)
        hit = (np.isfinite(loss) & (resid > thr) & (resid > floor) & (resid > gained)
               & (jump > thr) & (jump > float(th.min_rel_jump) * np.abs(prev))
               & (jump > gained))
    # A spike comes back down; a loss that stays up is divergence (its own detector).
    k = max(1, int(th.recover_steps))
    after = np.lib.stride_tricks.sliding_window_view(
        np.concatenate([loss.astype(np.float64)[1:], np.full(k, np.nan)]), k)[: len(loss)]
    later = _stats.nanmedian(after, axis=1)
    with np.errstate(invalid="ignore"):
        recovers = ~(later > prev + float(th.recover_frac) * jump)  # NaN (end) counts
        hit &= recovers & ~(np.isnan(later) & (np.arange(len(loss)) < len(loss) - 1))
    return np.flatnonzero(hit), base, resid, sigma, prev


def _relative_pattern(step: np.ndarray, loss: np.ndarray, th: Thresholds) -> Pattern | None:
    """A loop's structure on the log loss: a second task whose loss is 3× the first's is the
    same deviation at any level, though under a noisy CNN's per-batch noise only a few of its
    steps clear the spike bar (stats.periodic.phase_level)."""
    if not (loss > 0).all():
        return None
    ll = np.log(loss)
    dev = ll - _stats.rolling_median(ll, int(th.window))
    return phase_level(step, dev, _stats.mad_sigma(dev))


def _lr_caused(ctx: Context, r: int, first: int, last: int) -> bool:
    """Did a learning-rate rise set off the spikes in [first, last]: a jump just before the
    first, or a ramp into them that had taken the rate above what the run trains at (its
    median; a warm-up still rising is below it: the design, not an excess)."""
    cause = _changes.within(ctx, first - 10, last)
    if cause is None or cause.get("kind") != "lr_ramp":
        return cause is not None
    d = _data.steps(ctx).get(r)
    if d is None:
        return False
    lr = d["lr"]
    ok = np.isfinite(lr)
    at = lr[(d["step"] == first) & ok]
    return bool(ok.any() and len(at) and float(at[0]) > float(np.median(lr[ok])))


def _own_th(ctx: Context) -> Thresholds:
    """This detector's thresholds as the analysis configured them (for the helpers other
    detectors call)."""
    th = ctx.th(ID)
    if not isinstance(th, Thresholds):
        import sys

        from .. import thresholds

        th = thresholds.of(sys.modules[__name__])
    return th


def loop_pattern(ctx: Context) -> Pattern | None:
    """The loop's periodic structure in the loss (a second task every N steps, an
    evaluation, a curriculum's cycle), or None: the one that explains the spikes, else one
    whose phase stands above the others without spiking (stats.periodic.phase_level). The
    steps it explains are the design's, not the trend's: a detector judging whether the
    loss falls reads the other steps (a 3x task loss on every 4th step makes window medians
    of a falling loss jump up and down)."""
    th = _own_th(ctx)
    got = _analyse(ctx, th)
    if got is None:
        return None
    if got["pattern"] is not None:
        return got["pattern"]
    return ctx.cached(f"{ID}.loop_pattern.{hash(th)}",
                      lambda: _relative_pattern(got["step"], got["loss"], th))


def batch_span(ctx: Context) -> tuple[int, int] | None:
    """(step, until) of the batch that threw the run (:func:`batch_event`), or None: a
    setback at one step that other detectors must not read across (loss_plateau)."""
    got = _analyse(ctx, _own_th(ctx))
    if got is None or got["b"] is None:
        return None
    step = got["step"]
    return int(step[got["b"]]), int(step[min(got["until"], len(step) - 1)])


def spike_steps(ctx: Context) -> np.ndarray:
    """The steps of the loss's spikes (the loop's structure left out), a batch that threw the
    run among them: damage other detectors may attribute (gradient_explosion)."""
    got = _analyse(ctx, _own_th(ctx))
    if got is None:
        return np.zeros(0, dtype=np.int64)
    return got["step"][np.asarray(got["idx"], dtype=int)]  # (the batch is one of them)


def _analyse(ctx: Context, th: Thresholds) -> dict[str, Any] | None:
    """Everything :func:`detect` works from, computed once per analysis (shared with
    :func:`batch_span`)."""
    return ctx.cached(f"{ID}.analyse.{hash(th)}", lambda: _compute(ctx, th))


def _compute(ctx: Context, th: Thresholds) -> dict[str, Any] | None:
    series = _data.finite_loss(ctx, int(th.min_steps))
    if series is None:
        return None
    r, step, loss = series
    idx, base, resid, sigma, prev = find_spikes(step, loss, th)
    # a spike is one step's rise; the top of a climb over many steps (an instability that
    # corrects itself: a full-batch run at the edge of stability) is no batch (stats/excursion)
    idx = idx[single_step(loss, prev, idx, max(1, int(th.window) // 2))]
    # a rise that keeps an appointment (more than half the cycles at one phase) is design
    pattern = phase_pattern(step, resid / max(sigma, 1e-12), float(th.z)) if len(idx) else None
    if len(idx):  # (or on the log loss: the one that explains more of the spikes)
        rel = _relative_pattern(step, loss, th)
        if rel is not None and (pattern is None or sum(map(rel.explains, step[idx])) > sum(
                map(pattern.explains, step[idx]))):
            pattern = rel
    # (or the spikes it leaves keep an appointment of their own: a round-robin task far
    # above the others until it learns, on another phase of the same loop)
    rest = [i for i in idx if pattern is None or not pattern.explains(int(step[i]))]
    extra = one_phase(step[rest]) if rest else None
    if extra is not None:
        if pattern is not None and extra.period == pattern.period:
            pattern = Pattern(pattern.period, tuple(sorted({*pattern.phases, *extra.phases})),
                              pattern.cycles)
        elif pattern is None or not any(pattern.explains(int(step[i])) for i in idx):
            pattern = extra
    by_design: list[int] = []
    if pattern is not None and len(idx):
        by_design = [i for i in idx if pattern.explains(int(step[i]))]
        idx = np.asarray([i for i in idx if not pattern.explains(int(step[i]))], dtype=int)
    # one event far beyond all the others (a batch that threw the run) is a different
    # thing from a family of small spikes: the finding is dated at it, and it can be the
    # cause of what follows (causality.py)
    thrown = [t for t in _batch.throws(loss, prev, sigma, th)
              if pattern is None or not pattern.explains(int(step[t]))]
    idx = np.union1d(idx, thrown).astype(int)
    # spikes that come with a learning-rate rise (a jump just before the first, or a ramp
    # into it) once a level is set are the rate's doing; only the others can be the data's
    # heavy tail (a warm-up's rise is the first steps' by design)
    late = idx[idx >= int(th.window) // 2]
    caused = len(late) > 0 and _lr_caused(ctx, r, int(step[late[0]]), int(step[late[-1]]))
    idx, tail = _spike_tail.instability(loss, prev, idx[~np.isin(idx, late)] if caused else idx,
                                        sigma, th, resid > float(th.z) * sigma)
    if caused:
        idx = np.union1d(idx, late).astype(int)
    b, until = _batch.batch_event(ctx, step, loss, prev, idx)
    # an event that begins at the first batch of a new input shape, where those are rare,
    # is the data changing (a curriculum's next stage, a new source): explained, not an
    # accident; a batch among them is still a setback other detectors do not read across
    staged, stages = _batch.new_stages(ctx, r, step, loss, prev, idx)
    idx = idx[~np.isin(idx, staged)]
    return {"r": r, "step": step, "loss": loss, "idx": idx, "base": base, "resid": resid,
            "sigma": sigma, "prev": prev, "pattern": pattern, "by_design": by_design,
            "b": b, "until": until, "tail": tail, "stages": stages,
            "shown": None if b in staged else b}


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    got = _analyse(ctx, th)
    if got is None:
        return []
    r, step, loss, idx, base, resid, sigma, prev, pattern, by_design, b, until = (
        got[k] for k in ("r", "step", "loss", "idx", "base", "resid", "sigma", "prev",
                         "pattern", "by_design", "shown", "until"))
    if not len(idx):
        if by_design:
            return [_structure(r, step, by_design, pattern)]
        if got["stages"]:
            return [_stages(r, got["stages"])]
        tail = got["tail"]
        return [_spike_tail.finding(ID, r, step, loss, prev, tail)] if len(tail) else []
    worst = idx[np.argmax(resid[idx] / np.maximum(np.abs(base[idx]), 1e-12))]
    first = idx[0] if b is None else b
    spikes = [int(s) for s in step[idx][:20]]
    batch = None if b is None else {
        "step": int(step[b]), "loss": float(loss[b]),
        # where the loss was back (or the series' end, or its last finite point: into NaN)
        "until": int(step[min(until, len(step) - 1)]),
        "level": float(prev[b]) if b else None}
    sev = "error" if len(idx) >= th.error_count else "warning"
    # a learning rate rising into the spikes (a ramp, an endless warm-up) is their cause
    ramp = _changes.lr_ramp(ctx, int(step[first]) - 10, int(step[first]))
    ids = _data.sample_ids(ctx, sorted({int(step[first]), int(step[worst])}), r)
    return [Finding(
        id=ID, severity=sev, subject="loss", first_step=int(step[first]),
        title=f"{len(idx)} loss spike{'s' if len(idx) > 1 else ''}",
        message=(_batch_message(step, idx, batch, loss) if batch is not None else
                 _message(step, loss, base, resid, sigma, first, worst, len(idx)))
        + (f" They come as {ramp['text']}." if ramp is not None
           else _changes.early_lr_note(ctx, int(step[first]))),
        advice=DOC["fixes"], chart=anchors.LOSS,
        evidence={"count": len(idx), "spike_steps": spikes, "rank": r,
                  "first_loss": float(loss[first]), "first_local_median": float(base[first]),
                  "worst_step": int(step[worst]), "worst_loss": float(loss[worst]),
                  "robust_sigma": sigma, "batch": batch,
                  **({"sample_ids": {str(k): v for k, v in ids.items()}} if ids else {})})]


def _structure(r: int, step: np.ndarray, idx: list[int], pattern: Any) -> Finding:
    return Finding(
        id=ID, severity="info", subject="loss", first_step=int(step[idx[0]]),
        title=f"The loss rises every {pattern.period} steps: the loop's structure",
        message=(f"The loss is higher at the same point of a fixed cycle, {pattern.text()} "
                 "(cycle after cycle, while it lasts): a multi-task loop, a "
                 "curriculum, an evaluation or a data source every N steps, not an "
                 "accident."),
        advice="Nothing to fix if this is by design; log each task's loss as its own "
               "metric (rec.step(loss=..., task_b=...)) to follow each.",
        chart=anchors.LOSS,
        evidence={"period": pattern.period, "phases": list(pattern.phases),
                  "cycles": pattern.cycles, "count": len(idx), "rank": r,
                  "spike_steps": [int(s) for s in step[idx][:20]]})


def _stages(r: int, stages: list[dict[str, Any]]) -> Finding:
    what = "; ".join(f"×{x['loss'] / x['level']:.3g} at step {x['step']} ({x['level']:.4g} → "
                     f"{x['loss']:.4g}), back by step {x['until']}" if x["level"] > 0 else
                     f"at step {x['step']}, back by step {x['until']}" for x in stages[:5])
    n = len(stages)
    return Finding(
        id=ID, severity="info", subject="loss", first_step=int(stages[0]["step"]),
        title=(f"The loss jumped at {n} new stage{'s' if n > 1 else ''} of the data"),
        message=(f"The loss jumped {what}: {'each time ' if n > 1 else ''}at the first "
                 "batch of a new input shape (steps.new_shapes; rare in this run), and came "
                 "back as the model learned it. The data changed there (a curriculum's next "
                 "stage, a new source or length), not an accident of training."),
        advice="Nothing to fix if the data changes by design; a gentler ramp (mixing the "
               "new stage in gradually) softens the jump.",
        chart=anchors.LOSS,
        evidence={"rank": r, "stages": stages[:20], "count": n})


def _batch_message(step: np.ndarray, idx: np.ndarray, batch: dict[str, Any],
                   loss: np.ndarray) -> str:
    lvl = batch["level"]
    size = (f"from its level {lvl:.4g} to {batch['loss']:.4g} (×{batch['loss'] / lvl:.3g})"
            if lvl else f"to {batch['loss']:.4g}")
    rest = [i for i in idx if int(step[i]) != batch["step"]]
    # spikes before the loss was back are the knocked model's (_batch.events), the rest
    # the loss's own, each far smaller than the batch's jump
    knocked = [i for i in rest if batch["step"] < int(step[i]) <= batch["until"]]
    others = [int(step[i]) for i in rest if i not in knocked]
    text = f"One batch threw the loss {size} at step {batch['step']}"
    if knocked:
        big = max(knocked, key=lambda i: float(loss[i]))
        text += (f"; the model flailed until step {batch['until']} ({len(knocked)} more "
                 f"spike{'s' if len(knocked) > 1 else ''}, the largest "
                 f"{float(loss[big]):.4g} at step {int(step[big])})")
    return text + (f", {DOMINANT:g}× further than any other spike ({len(others)} smaller, "
                   f"the first at step {others[0]})." if others else ".")


def _message(step: np.ndarray, loss: np.ndarray, base: np.ndarray, resid: np.ndarray,
             sigma: float, first: int, worst: int, count: int) -> str:
    def at(i: int) -> str:
        return (f"step {int(step[i])} ({loss[i]:.4g} vs local median {base[i]:.4g}, "
                f"{resid[i] / max(sigma, 1e-12):.3g}× its usual step-to-step noise)")

    if count == 1:
        return f"The loss jumped far above its local level at {at(first)}."
    return (f"The loss jumped far above its local level at {count} steps, first at "
            f"{at(first)}; the largest at {at(worst)}.")
