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
from ...stats.onset import hinge, single_jump
from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _at_start, _changes, _data, loss_spike
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
    "rule": "after warm-up (warmup_frac of the run), the smoothed log grad norm (before "
            "clipping) rises by ln(factor) above both its minimum over the previous window "
            "steps and its typical level since warm-up, mostly monotonically (min_up_frac), "
            "stays up for sustain points or turns nonfinite; a layer must also reach "
            "min_share of the total norm's typical level; and the loss must get worse over "
            "the growth (rise by 2σ of its step noise, or turn nonfinite) unless the level it "
            "held (smoothed: one batch's spike is not a level) is factor × the total's "
            "typical level: norms that grow "
            "while the loss keeps falling are learning, and so is a transient rise that "
            "settles back to its baseline for the rest of the run while the loss ends "
            "below its level at the onset (with or without clipping). The onset is the "
            "change point of the smoothed log norm (best flat-then-rising fit), or the one "
            "step that takes the raw norm out of its baseline's range for good by ln(factor) "
            "(a batch that threw the run), or that batch's step (loss_spike's batch event) "
            "when the growth reached its size only after it (before it, the smoothed norm "
            "had not risen by ln(factor) from the onset), or the run's start when the "
            "prefix before it is too short to be a baseline and went up; first_step that "
            "onset or the "
            "learning-rate jump just before it; a gradual LR rise into it is named as the "
            "cause. A first gradient factor² above the run's later median beyond what the "
            "loss's own fall explains is an explosion at the start (_at_start.py). Subject: "
            "the tensor with the largest growth against its own baseline (from its start, "
            "for a growth from the run's start), the recurrent weight of a recurrent "
            "network's explosion at the start, or the total norm when at least BROAD of "
            "the tensors explode.",
    "fixes": "Lower the learning rate, add gradient clipping (clip_grad_norm_), LR warm-up, "
             "normalisation layers, check the loss scale with fp16.",
}


def find_explosion(step: np.ndarray, logn: np.ndarray, ends_nonfinite: bool, window_pts: int,
                   th: Thresholds, onset_min: int = 0, batch: int | None = None
                   ) -> dict[str, Any] | None:
    """Onset/crossing of a sustained rise in a log-norm series (NaN = missing point) whose
    onset is at or after step ``onset_min`` (the end of the run's warm-up). ``batch``: the
    step of a batch that threw the run (loss_spike's batch event), if any."""
    ok = np.isfinite(logn)
    step, x = step[ok], logn[ok]
    # A growth that runs into NaN/Inf within a few steps of the start has no warm-up to
    # skip and few points to show: 4 rising ones into a NaN are unmistakable.
    if not len(x):
        return None
    short = ends_nonfinite and len(x) < th.min_points + th.warmup_steps
    keep = step >= (step[0] + (0 if short else th.warmup_steps))
    all_step, all_x = step, x
    step, x = step[keep], x[keep]
    if len(x) < (min(4, th.min_points) if short else th.min_points):
        return None
    xs = _stats.rolling_median(x, int(th.smooth))
    w = max(2, int(window_pts))
    pad = np.concatenate([np.full(w, np.inf), xs])
    win = np.lib.stride_tricks.sliding_window_view(pad, w + 1)[:, :-1]  # previous w points
    lo = win.min(axis=1)
    lo_at = win.argmin(axis=1) - w + np.arange(len(xs))  # index of that minimum
    # The rise must also clear the window's typical level (median), not just its minimum:
    # a small tensor's gradient (e.g. a bias near convergence) is noisy in log space and
    # rebounds 10x from a single deep dip back to its usual level without growing at all.
    # (all-NaN padding windows give NaN)
    typical = _stats.nanmedian(np.where(np.isinf(win), np.nan, win), axis=1)
    need = math.log(float(th.factor))
    with np.errstate(invalid="ignore"):
        # (a third of the rise above the window's median: steady 5%-a-step growth sits half
        # way up its own window, a rebound from one deep dip sits at the median)
        rising = (xs - lo >= need) & (xs - typical >= need / 3)
    for i in np.flatnonzero(rising):
        j = int(lo_at[i])
        if j < 0:
            continue
        # mostly rising: on the smoothed series, or as a significant monotone trend of the
        # raw one (a noisy norm growing 5% a step has only ~60% rising raw steps)
        seg = xs[j:i + 1]
        up = float(np.mean(np.diff(seg) > 0)) if len(seg) > 1 else 0.0
        end = min(len(x), i + int(th.sustain) + 1)
        if up < th.min_up_frac and not (
                len(seg) >= 8 and _stats.mann_kendall(x[j:i + 1])[1] < 0.001) and \
                single_jump(x, j, i, need, w, end) == j:  # (or one step out of the noise)
            continue
        rest = xs[i:i + int(th.sustain)]
        # NaN/Inf right after the growth ends it; NaN long after (a bad batch 150 steps
        # later) says nothing about this rise
        nan_ends_it = ends_nonfinite and len(xs) - i <= w
        sustained = bool(np.all(rest >= lo[i] + need / 2)) and (
            len(rest) >= th.sustain or nan_ends_it or i + len(rest) == len(xs))
        if not sustained:
            continue
        # onset: the last point still at the typical level before the rise (a flat, noisy
        # baseline has its minimum anywhere; growth starts where the series leaves that
        # level for good). The level is the median of the window before the minimum, so the
        # growth itself does not raise it.
        level = typical[j] if np.isfinite(typical[j]) else lo[i]
        near = np.flatnonzero(xs[j:i + 1] <= max(level, lo[i]) + 0.1 * need)
        j = j + int(near[-1]) if len(near) else j
        # the change point: where a flat baseline turns into the sustained rise (a noisy
        # baseline's low point is not where growth starts)
        j = hinge(xs, max(0, j - w), i, j)
        # a prefix too short to be a baseline (under min_points from the run's first point,
        # warm-up included) that went up by the rise test's own tolerance, or only went up,
        # is the growth's own start, not a calm level it left: dated from the start
        pre = all_x[all_step <= step[j]]
        if j > 0 and len(pre) <= int(th.min_points) and (
                pre[-1] - pre[0] >= need / 3 or bool(np.all(np.diff(pre) > 0))):
            j = 0
        jump = single_jump(x, j, i, need, w, end)
        # early training: norms rise on their own and settle (an embedding's or a bias's
        # gradient grows from its small initial level as the model learns). A rise from
        # the warm-up counts only when it does not settle: it runs into NaN/Inf or is still
        # growing at the end of the series; it is then dated from its own start (issue 45:
        # a textbook explosion grows from step 0, with no calm prefix)
        to_end = bool(np.all(xs[i:] >= lo[i] + need / 2)) and int(np.argmax(xs)) >= len(
            xs) - max(3, w // 5)
        if int(step[j]) < onset_min and not (nan_ends_it or to_end):
            continue
        # the rise must also clear the series' typical level since warm-up (not just a
        # local dip) and actually go up from where it started
        baseline = float(np.median(xs[:j + 1]))
        peak = float(np.max(xs[i:i + int(th.sustain) + 1]))
        if peak - baseline < need or x[i] <= x[j]:
            continue
        slope, _ = _stats.theil_sen(step[j:i + 1].astype(float), x[j:i + 1])
        onset, start_x = int(step[j]), float(x[j])
        if j == 0 and slope > 0:  # the first point looked at: the warm-up's points before
            k = int(np.searchsorted(all_step, step[0]))  # it on the same line start it
            while k > 0 and all_x[k - 1] < all_x[k] - 0.5 * slope * (
                    all_step[k] - all_step[k - 1]):
                k -= 1
            onset, start_x = int(all_step[k]), float(all_x[k])
            # no level before it: its baseline is where it started
            baseline = min(baseline, start_x)
        if jump > j:  # dated to the jump, from the level before it; crossed there at once
            onset, start_x, i = int(step[jump]), float(x[jump - 1]), max(i, jump)
        # a growth that reached its size only after a batch threw the run began with the
        # batch (bad batch -> spike -> explosion): before it, the series had not risen by
        # the factor from where the onset put it (an MoE expert's gradient drifting x2 while
        # its share of tokens grows, then knocked x5 up for 15 steps by the batch)
        if batch is not None and onset < batch <= int(step[i]):
            b = int(np.searchsorted(step, batch))
            if 0 < b < len(x) and float(np.max(xs[j:b])) - float(xs[j]) < need:
                onset, start_x, i = int(step[b]), float(x[b - 1]), max(i, b)
        # back down to (near) the baseline for the rest of the run: the rise ended
        down = xs[i:] <= baseline + need / 2
        after = np.flatnonzero(~down)
        settled = bool(down[-1]) and not ends_nonfinite and len(after) < len(down)
        return {"onset": onset, "cross": int(step[i]),
                # still growing into the series' end (the first NaN, if any): its highest
                # point among the last few before it, and up since the crossing
                "into_end": bool(np.all(xs[i:] >= lo[i] + need / 2)
                                 and int(np.argmax(xs)) >= len(xs) - max(3, w // 5)),
                "settled_at": int(step[i + int(after[-1]) + 1]) if settled and len(after)
                else None, "from": float(math.exp(start_x)),
                "to": float(math.exp(x[i])), "per_step": float(math.exp(slope)),
                "max": float(math.exp(np.max(x))), "baseline": float(math.exp(baseline)),
                # the level the growth held (smoothed: one batch's spike, a loss_spike's
                # business, is not a level any growth reached)
                "held": float(math.exp(np.max(xs)))}
    return None


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


def _learned_through(ctx: Context, res: Mapping[str, Any]) -> bool:
    """A transient rise: the norms came back down to their baseline for the rest of the run
    while the loss kept falling (its level at the end is clearly below its level at the
    onset). That is a learning transition, with or without clipping, not an explosion."""
    if res.get("settled_at") is None or res.get("first_nonfinite") is not None:
        return False
    series = _data.finite_loss(ctx, 1)
    if series is None:
        return False
    _, step, loss = series
    at = loss[(step >= res["onset"] - 5) & (step <= res["onset"] + 5)]
    end = loss[step >= max(res["settled_at"], int(step[-1]) - max(10, len(step) // 10))]
    if len(at) < 3 or len(end) < 3:
        return False
    noise = _stats.mad_sigma(np.diff(loss)) / math.sqrt(2)
    return float(np.median(end)) < float(np.median(at)) - 2 * noise


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    total = None
    typical_total = None
    r = _data.primary_rank(ctx, "grad_norm")
    thrown = loss_spike.batch_span(ctx)
    batch = None if thrown is None else thrown[0]
    lo, hi = _data.step_range(ctx)
    onset_min = 0 if lo is None else lo + max(
        int(th.warmup_steps), int(float(th.warmup_frac) * (hi - lo + 1)))
    if r is not None:
        d = _data.steps(ctx)[r]
        g0 = d["grad_norm"][np.isfinite(d["grad_norm"]) & (d["grad_norm"] > 0)]
        if len(g0):
            typical_total = float(np.median(g0))
        g = d["grad_norm"]
        given = d["grad_norm_given"]
        with np.errstate(all="ignore"):
            logn = np.where(given & np.isfinite(g) & (g > 0), np.log(g), np.nan)
        bad = np.flatnonzero(given & ~np.isfinite(g))
        cut = bad[0] if len(bad) else len(g)
        total = find_explosion(d["step"][:cut], logn[:cut], bool(len(bad)), int(th.window),
                               th, onset_min, batch)
        if total is not None:
            total["first_nonfinite"] = _nan_after(total, int(d["step"][bad[0]]) if len(bad)
                                                  else None, int(th.window))
    layers = []
    tb = _data.tensor_buckets(ctx)
    size = tb["bucket_size"]
    for name, s in _data.series_of(ctx, "grad").items():
        bad = np.flatnonzero(s["n_nonfinite"] > 0)
        cut = bad[0] if len(bad) else len(s["step0"])
        res = find_explosion(s["step0"][:cut].astype(np.int64), s["log_norm"][:cut],
                             bool(len(bad)), max(2, int(th.window) // size), th,
                             onset_min, batch)
        if res is not None and typical_total is not None and \
                res["max"] < float(th.min_share) * typical_total:
            res = None  # grows, but stays negligible next to the whole model's gradient
        if res is not None:
            res["name"] = name
            # a NaN is this tensor's doing only when its gradient grew far past the model's
            # usual total on the way (BERT's query weights grow 1000x to an ordinary level
            # while they learn; a forward NaN after that is not their explosion)
            big = typical_total is None or res["max"] >= float(th.factor) * typical_total
            res["into_end"] = res["into_end"] and big
            res["may_end_in_nan"] = big
            res["first_nonfinite"] = _nan_after(
                res, int(s["first_nonfinite"][bad[0]]) if len(bad) and big else None,
                int(th.window))
            layers.append(res)
    # An explosion breaks training: the loss stops improving (rises, or turns NaN) while the
    # norms grow. A layer whose gradient grows while the loss keeps falling is learning
    # (BERT's attention query/key weights start near zero and grow 1000x as the heads learn
    # to attend): not an explosion.
    # (Unless the growth dwarfs the whole model's usual gradient: a layer ending 10x above
    # the total's typical level is abnormal whatever the loss does yet.)
    def extreme(x: Mapping[str, Any]) -> bool:
        return typical_total is not None and x["held"] >= float(th.factor) * typical_total

    win = int(th.window)

    def real(x: Mapping[str, Any] | None) -> bool:
        return x is not None and not _learned_through(ctx, x) and (
            _hurts(ctx, x, win) or extreme(x))

    total = total if real(total) else None
    layers = [x for x in layers if real(x)]
    if total is None and not layers:
        start = _at_start.explosion_at_start(ctx, th)  # exploded before any level to grow
        return [_at_start.finding(ctx, start, ID, DOC["fixes"])] if start else []
    # The subject: the tensor whose norm grew most against its own baseline (the first in
    # model order is often the embedding, which the growth reaches last, not first), or the
    # total when the growth is broad (at least BROAD of the tensors).
    for x in layers:
        x["growth"] = x["max"] / max(x["baseline"], 1e-30)
    layers.sort(key=lambda x: -x["growth"])
    n_tensors = max(1, len(_data.series_of(ctx, "grad")))
    broad = total is not None and (not layers or len(layers) >= BROAD * n_tensors)
    main = total if total is not None else layers[0]
    first = main["onset"] if broad else min(
        [main["onset"], layers[0]["onset"]])
    subject = "grad_norm" if broad or not layers else layers[0]["name"]
    what = "total gradient norm" if total is not None else f"gradient norm of {subject}"
    nan_at = main.get("first_nonfinite")
    cause = _changes.within(ctx, int(first) - 10, int(main["cross"]) + 2)
    first, because = _changes.dated_by(cause, first)
    clipped = r is not None and bool(np.isfinite(_data.steps(ctx)[r]["grad_clip_max"]).any())
    msg = (f"The {what}{' (before clipping)' if clipped else ''} grew from "
           f"{main['from']:.3g} at step "
           f"{main['onset']} to {main['to']:.3g} by step {main['cross']}{because}"
           + (f", and went nonfinite at step {nan_at}" if nan_at is not None else "") + ".")
    if layers:
        msg += (f" {len(layers)} tensor(s) explode; most, against its own baseline: "
                f"{layers[0]['name']} (×{layers[0]['growth']:.3g}, from step "
                f"{layers[0]['onset']}).")
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
