"""gradient_explosion: sustained geometric growth of the total or a layer's gradient norm.

Works on log norms: geometric growth is a straight rising line there. A rise of
ln(factor) of the smoothed log norm above its minimum over the previous ``window`` steps that
is sustained (or ends in NaN/Inf) is an explosion; its onset is that minimum, which is
typically many steps before the first NaN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...stats import robust as _stats
from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _at_start, _changes, _clipped, _data, _growth, loss_spike
from .base import Context

ID = "gradient_explosion"
NEEDS: tuple[str, ...] = ("gradients",)
BROAD = 0.5
"""The growth is the whole model's (subject: the total norm) when at least this share of
the tensors explode with it."""
DEFAULTS: dict[str, Any] = {
    "factor": 10.0,        # the norm grows at least this many times ...
    "window": 50,          # ... within this many steps
    "smooth": 3,           # rolling-median points before looking (one noisy step is not growth)
    "sustain": 3,          # and stays above half that rise for this many points (or goes NaN)
    "min_up_frac": 0.6,    # share of rising (smoothed) steps between onset and crossing, or
                           # a Mann–Kendall rise at p < 0.001
    "warmup_steps": 3,     # ignore the first steps (norms settle after init) ...
    "warmup_frac": 0.1,    # ... and this share of the run (early training's normal rise)
    "min_points": 8,
    "min_share": 0.05,     # a layer's norm must reach this share of the total's typical
                           # level (a tiny bias gradient growing 10x is not an explosion)
}
DOC = {
    "meaning": "Gradient norms grow geometrically (total or one layer): training is blowing up.",
    "rule": "after warm-up (warmup_frac of the run), the smoothed log grad norm (as "
            "applied: times min(1, grad_clip_max/norm) where clipping bit, _clipped.py) "
            "rises by ln(factor) above both its minimum over the previous window "
            "steps and its typical level since warm-up, mostly monotonically (min_up_frac), "
            "stays up for sustain points or turns nonfinite; a layer must also reach "
            "min_share of the total norm's typical level; and the loss must get worse over "
            "the growth (rise by 2σ of its step noise, or turn nonfinite) unless the level it "
            "held (smoothed: one batch's spike is not a level) is factor × the total's "
            "typical level: norms that grow "
            "while the loss keeps falling are learning, and so is a transient rise that "
            "settles back to its baseline for the rest of the run, or ends at least "
            "sqrt(factor) below the level it held, while the loss ends below its level at "
            "the onset (with or without clipping: a new head's gradient surges once at the "
            "peak learning rate and settles at its new level). Each series is read episode "
            "by episode (a later one rises from a minimum after the earlier one's crossing; "
            "each is judged on what it did before the next one's onset — a burst that "
            "settled back to its baseline, on through the later episodes that are no "
            "explosion either, judged from the last back: what repeated bursts left shows "
            "once they are over; "
            "an episode that held its level for a window, a factor below where the series "
            "ended, did not grow into that end or its NaN: the later rise did), "
            "the first that is an explosion reported; an episode that began before a batch "
            "threw the run is read up to the batch, against the total's typical level "
            "before it (unless the loss jumped at the growth's culmination: crossed "
            "before, at its peak within a few points, still rising — the growth's own "
            "consequence); a growth that began at a new stage of the data (the first batch "
            "of a new input shape, where those are rare), or reached its size only after "
            "one, and came back down (to its baseline, or sqrt(factor) below the level it "
            "held), is the new data's: no explosion. The onset is the "
            "change point of the smoothed log norm (best flat-then-rising fit), or the one "
            "step that takes the raw norm out of its baseline's range for good by ln(factor) "
            "(from inside the range, or from within half the factor of it at the step "
            "after the one that left it: a noise blip just before the jump; a series out of "
            "its range for longer is growing already) "
            "(a batch that threw the run), or that batch's step (loss_spike's batch event) "
            "when the growth reached its size only after it (its level just before the "
            "batch had not risen by ln(factor) above its level at the onset, each the "
            "median of LEVEL_PTS smoothed points: a noisy tensor's peak after a dip is no "
            "growth), or the run's start when the "
            "prefix before it is too short to be a baseline and went up, or rose all along "
            "at explosion speed (ln(factor) per window, Mann–Kendall p < 0.01: no calm "
            "level; a jump is then one more step of the rise); first_step that "
            "onset or the "
            "learning-rate jump just before it; a gradual LR rise into it is named as the "
            "cause. A first gradient factor² above the run's later median (before its "
            "gradients vanished for good, _collapse.py) beyond what the loss's own fall "
            "explains is an explosion at the start (_at_start.py). Subject: "
            "the tensor that grew by the factor before any other began to grow (it leads: "
            "an RNN's recurrent weight), else the tensor with the largest growth against "
            "its own baseline (from its start, "
            "for a growth from the run's start), the recurrent weight of a recurrent "
            "network's explosion at the start, or the total norm when at least BROAD of "
            "the tensors explode.",
    "fixes": "Lower the learning rate, add gradient clipping (clip_grad_norm_), LR warm-up, "
             "normalisation layers, check the loss scale with fp16.",
}


def _nan_after(res: Mapping[str, Any], nan_at: int | None, window: int) -> int | None:
    """The step the growth ended in NaN/Inf: when the norm was still growing into it (at its
    highest right before), or it came within ``window`` steps of the crossing. (A layer's
    growth that stayed below the model's usual total, as attention weights grow while they
    learn, is never blamed for a NaN: see detect.)"""
    if nan_at is None:
        return None
    return nan_at if res.get("into_end") or nan_at - res["cross"] <= window else None


def _hurts(ctx: Context, res: Mapping[str, Any], window: int) -> bool:
    """Did the loss get worse over the growth (onset → a little after the crossing), or did
    the growth end in NaN/Inf within ``window`` steps? True without a loss to tell (the
    norms alone must then do)."""
    if res.get("first_nonfinite") is not None:
        return True  # it grew right into a NaN/Inf
    r = _data.primary_rank(ctx, "loss")
    if r is None:
        return True
    d = _data.steps(ctx)[r]
    step, loss = d["step"], d["loss"]
    ok = np.isfinite(loss)
    if ok.sum() < 10:
        return True
    if res.get("may_end_in_nan", True) and (~ok & d["loss_given"] & (step >= res["onset"])
                                             & (step <= res["cross"] + window)).any():
        return True  # the loss went nonfinite right after the growth
    step, loss = step[ok], loss[ok]
    span = max(5, res["cross"] - res["onset"])
    before = loss[(step >= res["onset"] - span) & (step <= res["onset"])]
    # around the crossing, not long after it: damage done later by something else (an LR
    # jump 10 steps after BERT's attention weights finished growing) is not this growth's
    lag = max(5, span // 4)
    after = loss[(step >= res["cross"] - lag) & (step <= res["cross"] + lag)]
    if len(before) < 3 and res["onset"] <= int(step[0]) + 2:
        before = loss[:3]  # a growth from the run's start: against the first losses
    if len(before) < 3 or len(after) < 3:
        return True
    noise = _stats.mad_sigma(np.diff(loss)) / math.sqrt(2)
    return float(np.median(after)) > float(np.median(before)) + 2 * noise


def _new_datas(res: Mapping[str, Any], factor: float) -> bool:
    """A growth that began where the data changed (the first batch of a new input shape, in
    a run where those are rare: a curriculum's longer sequences) and came back down (to its
    baseline, or sqrt(factor) below the level it held, never into NaN/Inf nor still growing
    at the end) is the new data's gradient while the model learns it, as the loss's jump
    there is (loss_spike): the loss before it is no level to judge by, the data is not the
    same."""
    return res.get("stage") is not None and res.get("first_nonfinite") is None and \
        not res.get("into_end") and _down_since(res, factor) is not None


def _down_since(res: Mapping[str, Any], factor: float) -> int | None:
    """Since when the norms are back down: the crossing when the growth ended sqrt(factor)
    (half the rise, in logs) below the level it held, else where it settled back to its
    baseline for the rest of its story (after the crossing), else None."""
    end = res.get("end_level")
    if end is not None and end <= res["held"] / math.sqrt(factor):
        return int(res["cross"])
    return res.get("settled_at")


def _learned_through(ctx: Context, res: Mapping[str, Any], factor: float, window: int
                     ) -> bool:
    """A transient rise: the norms came back down, to their baseline for the rest of the
    run, or from the level the growth held by at least sqrt(factor) (half the rise, in logs)
    by the end, and the loss ends clearly below its level before the onset (it kept
    learning), or no worse than it with no loss spike on the way (nothing it did remains,
    and it did nothing a spike would show). That is a learning transition (a new head's
    gradient grows as its features become informative, surges once at the peak learning
    rate and settles at its new, higher level), with or without clipping, not an explosion:
    an explosion does lasting harm, or throws the loss (a x100 learning rate under clipping:
    the loss x10 for a step, back within 15)."""
    if res.get("first_nonfinite") is not None:
        return False
    since = _down_since(res, factor)
    levels = _loss_levels(ctx, res, since) if since is not None else None
    if levels is None:
        return False
    before, after, se = levels
    if after < before - 2 * se:
        return True
    spikes = loss_spike.spike_steps(ctx)
    thrown = ((spikes >= res["onset"]) & (spikes <= res["cross"] + window)).any()
    return after <= before + 2 * se and not thrown


def _improved_for_a_window(ctx: Context, res: Mapping[str, Any], window: int) -> bool:
    """Did the loss keep improving while the gradient grew and after: the growth's story (up
    to the next episode, a batch, or the end) ran ``window`` steps from its onset and past
    its crossing, finite, and the loss at its end sits clearly below its level before the
    onset? A level far above the model's usual gradient is abnormal whatever the loss does
    *yet*; a window on, with the growth over, the loss has answered (a CNN's pre-clipping
    norm x40 while it learns from chance to 0.65)."""
    until = res.get("until")
    if until is None or until < max(res["onset"] + window, res["cross"] + 1) or \
            res.get("first_nonfinite") is not None or res.get("into_end"):
        # (still growing into the end: the loss has not answered the growth yet)
        return False
    levels = _loss_levels(ctx, res, None)
    return levels is not None and levels[1] < levels[0] - 2 * levels[2]


def _loss_levels(ctx: Context, res: Mapping[str, Any], since: int | None
                 ) -> tuple[float, float, float] | None:
    """(before, after, se): the loss's level when the growth began (the median of the 10
    steps before its onset: a sharp episode's own damage is no level it had reached) and at
    the end of its story (the median of its last tenth, from ``since`` on; a later
    episode's damage is that one's), with the standard error of their difference (two
    medians compared at two of them). None with fewer than 3 losses on either side."""
    series = _data.finite_loss(ctx, 1)
    if series is None:
        return None
    _, step, loss = series
    at = loss[(step >= res["onset"] - 10) & (step < res["onset"])]
    until = min(int(res.get("until", step[-1])), int(step[-1]))
    lo = until - max(10, len(step) // 10)
    end = loss[(step >= (lo if since is None else max(since, lo))) & (step <= until)]
    if len(at) < 3 or len(end) < 3:
        return None
    noise = _stats.mad_sigma(np.diff(loss)) / math.sqrt(2)
    se = 1.25 * noise * math.sqrt(1 / len(at) + 1 / len(end))
    return float(np.median(at)), float(np.median(end)), se


def find_explosion(step: np.ndarray, logn: np.ndarray, ends_nonfinite: bool, window_pts: int,
                   th: Thresholds, onset_min: int = 0, batch: int | None = None
                   ) -> dict[str, Any] | None:
    """The first growth episode of a log-norm series (:func:`_growth.find_explosions`)."""
    return next(_growth.find_explosions(step, logn, ends_nonfinite, window_pts, th,
                                        onset_min, batch), None)


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    total = None
    typical_total = typical_before = None
    r = _data.primary_rank(ctx, "grad_norm")
    thrown = loss_spike.batch_span(ctx)
    batch = None if thrown is None else thrown[0]
    lo, hi = _data.step_range(ctx)
    onset_min = 0 if lo is None else lo + max(
        int(th.warmup_steps), int(float(th.warmup_frac) * (hi - lo + 1)))
    win = int(th.window)
    stages = _data.new_shape_steps(_data.steps(ctx).get(_data.primary_rank(ctx, "loss")))

    # An explosion breaks training: the loss stops improving (rises, or turns NaN) while the
    # norms grow. A layer whose gradient grows while the loss keeps falling is learning
    # (BERT's attention query/key weights start near zero and grow 1000x as the heads learn
    # to attend): not an explosion.
    # (Unless the growth dwarfs the whole model's usual gradient: a layer ending 10x above
    # the total's typical level is abnormal whatever the loss does yet.)
    # (An episode that began before a batch threw the run is read up to the batch, against
    # the model's usual gradient up to it: the batch may leave the model in another regime.)
    def extreme(x: Mapping[str, Any]) -> bool:
        usual = typical_before if batch is not None and x["onset"] < batch else typical_total
        return usual is not None and x["held"] >= float(th.factor) * usual

    def real(x: Mapping[str, Any]) -> bool:
        if _new_datas(x, float(th.factor)):
            return False
        return not _learned_through(ctx, x, float(th.factor), win) and (
            _hurts(ctx, x, win) or (extreme(x) and not _improved_for_a_window(ctx, x, win)))

    clip = None  # ln of the factor clipping applied per step (_clipped.py)
    applied = False  # the explosion was found on the norm as applied
    if r is not None:
        d = _data.steps(ctx)[r]
        g = d["grad_norm"]
        given = d["grad_norm_given"]
        clip = _clipped.log_factor(g, d["grad_clip_max"])

        def first_of(gs: np.ndarray) -> dict[str, Any] | None:
            """The first episode of ``gs`` that is an explosion (a learning transition
            before a batch that threw the run is not; the batch's own episode may be),
            against the series' own usual level (and before the batch that threw the run)."""
            nonlocal typical_total, typical_before
            ok = np.isfinite(gs) & (gs > 0)
            typical_total = float(np.median(gs[ok])) if ok.any() else None
            if batch is not None:
                ok &= d["step"] < batch
                typical_before = float(np.median(gs[ok])) if ok.any() else None
            with np.errstate(all="ignore"):
                logn = np.where(given & np.isfinite(gs) & (gs > 0), np.log(gs), np.nan)
            bad = np.flatnonzero(given & ~np.isfinite(gs))
            cut = bad[0] if len(bad) else len(gs)
            eps = list(_growth.find_explosions(d["step"][:cut], logn[:cut], bool(len(bad)),
                                               win, th, onset_min, batch, stages))
            for ep in eps:
                ep["first_nonfinite"] = _nan_after(ep, int(d["step"][bad[0]]) if len(bad)
                                                   else None, win)
            return _growth.first_real(eps, real, batch)
        # before clipping (the landscape: a clipped run whose every update pushes the same
        # way still blows up) and as applied (a clip taken away lets the norm through)
        app = first_of(g * np.exp(clip)) if clip is not None else None
        total = first_of(g)  # (last: the tensors below are read against the raw total)
        if app is not None and (total is None or app["onset"] < total["onset"]):
            total, applied = app, True
    layers = []
    tb = _data.tensor_buckets(ctx)
    size = tb["bucket_size"]
    for name, s in _data.series_of(ctx, "grad").items():
        bad = np.flatnonzero(s["n_nonfinite"] > 0)
        cut = bad[0] if len(bad) else len(s["step0"])
        eps = []
        for res in _growth.find_explosions(
                s["step0"][:cut].astype(np.int64), s["log_norm"][:cut], bool(len(bad)),
                max(2, win // size), th, onset_min, batch, stages):
            if typical_total is not None and res["max"] < float(th.min_share) * typical_total:
                continue  # grows, but stays negligible next to the whole model's gradient
            if clip is not None and _clipped.held(d["step"], clip, res["onset"], res["cross"]) \
                    and _changes.within(ctx, res["onset"] - 10, res["cross"] + 2) is None:
                continue  # its part of an update the clip held (and no LR rise scaled it)
            res["name"] = name
            # a NaN is this tensor's doing only when its gradient grew far past the model's
            # usual total on the way (BERT's query weights grow 1000x to an ordinary level
            # while they learn; a forward NaN after that is not their explosion)
            big = typical_total is None or res["max"] >= float(th.factor) * typical_total
            res["into_end"] = res["into_end"] and big
            res["may_end_in_nan"] = big
            res["first_nonfinite"] = _nan_after(
                res, int(s["first_nonfinite"][bad[0]]) if len(bad) and big else None, win)
            eps.append(res)
        hit = _growth.first_real(eps, real, batch)
        if hit is not None:
            layers.append(hit)
    if total is None and not layers:
        start = _at_start.explosion_at_start(ctx, th)  # exploded before any level to grow
        return [_at_start.finding(ctx, start, ID, DOC["fixes"])] if start else []
    # The subject: the tensor whose norm grew most against its own baseline (the first in
    # model order is often the embedding, which the growth reaches last, not first), or the
    # total when the growth is broad (at least BROAD of the tensors).
    # A tensor that grew by the factor before any other began to grow leads, broad or not
    # (an RNN's recurrent weight: the readout's and input weights' gradients only follow it
    # into the blow-up), and is named first.
    for x in layers:
        x["growth"] = x["max"] / max(x["baseline"], 1e-30)
    layers.sort(key=lambda x: -x["growth"])
    lead = min(layers, key=lambda x: x["onset"]) if len(layers) > 1 else None
    if lead is not None and all(x["onset"] >= lead["cross"] and x["onset"] > lead["onset"]
                                for x in layers if x is not lead):
        layers.remove(lead)
        layers.insert(0, lead)
    else:
        lead = None
    n_tensors = max(1, len(_data.series_of(ctx, "grad")))
    broad = total is not None and lead is None and (
        not layers or len(layers) >= BROAD * n_tensors)
    main = total if total is not None else layers[0]
    first = main["onset"] if broad else min(
        [main["onset"], layers[0]["onset"]])
    subject = "grad_norm" if broad or not layers else layers[0]["name"]
    if lead is None and not broad:  # (at once: a recurrent net's goes through its recurrence)
        subject = next((x["name"] for x in layers if _at_start.RECURRENT.search(x["name"])),
                       subject)
    what = "total gradient norm" if total is not None else f"gradient norm of {subject}"
    nan_at = main.get("first_nonfinite")
    cause = _changes.within(ctx, int(first) - 10, int(main["cross"]) + 2)
    first, because = _changes.dated_by(cause, first)
    clipped = r is not None and bool(np.isfinite(_data.steps(ctx)[r]["grad_clip_max"]).any())
    msg = (f"The {what}" + (" (as applied, after clipping)" if applied else
                            " (before clipping)" if clipped else "") + " "
           + (f"jumped from {main['from']:.3g} to {main['to']:.3g} at step {main['cross']}"
              if main["cross"] == main["onset"] else
              f"grew from {main['from']:.3g} at step {main['onset']} to {main['to']:.3g} by "
              f"step {main['cross']}") + f"{because}"
           + (f", and went nonfinite at step {nan_at}" if nan_at is not None else "") + ".")
    if lead is not None:
        msg += (f" {len(layers)} tensor(s) explode, led by {lead['name']} (from step "
                f"{lead['onset']}, ×{float(th.factor):.3g} by step {lead['cross']}, before "
                f"any other began to grow; the others from step "
                f"{min(x['onset'] for x in layers[1:])}).")
    elif layers:
        msg += (f" {len(layers)} tensor(s) explode; most, against its own baseline: "
                f"{layers[0]['name']} (×{layers[0]['growth']:.3g}, from step "
                f"{layers[0]['onset']}).")
    if applied:
        msg += _clipped.lifted_note(d["step"], d["grad_clip_max"], int(main["onset"]))
    if cause is None:
        msg += _changes.early_lr_note(ctx, int(first))
    return [Finding(
        id=ID, severity="error", subject=subject, first_step=int(first),
        title=f"Gradient explosion from step {first}",
        message=msg, advice=DOC["fixes"], chart=anchors.GRAD_HEATMAP,
        evidence={"onset_step": main["onset"], "crossing_step": main["cross"],
                  "norm_at_onset": main["from"], "norm_at_crossing": main["to"],
                  "growth_per_step": main["per_step"], "max_norm": main["max"],
                  "first_nonfinite_step": nan_at, "total_norm_exploded": total is not None,
                  "layers": [x["name"] for x in layers[:10]],
                  "layers_exploding": len(layers), "cause": cause})]
