"""Episodes of sustained geometric growth in a log-norm series (gradient_explosion's engine).

Works on log norms: geometric growth is a straight rising line there. A rise of ln(factor) of
the smoothed log norm above its minimum over the previous ``window`` points that is sustained
(or ends in NaN/Inf) is a growth episode; its onset is the change point where the flat level
turns into the rise. A series can hold several (a model's gradients grow as it starts to learn
and settle at their new level; a bad batch 100 steps later throws them again): each is judged
on its own, the later one rising from a minimum after the earlier one's crossing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import numpy as np

from ...stats import robust as _stats
from ...stats.onset import hinge, single_jump
from ..thresholds import Thresholds

LEVEL_PTS = 3
"""Points of the smoothed series whose median is a level (at a growth's onset, just before a
batch): one more than the smoothing's own half width, so one noisy point is never a level."""


def find_explosions(step: np.ndarray, logn: np.ndarray, ends_nonfinite: bool, window_pts: int,
                    th: Thresholds, onset_min: int = 0, batch: int | None = None,
                    stages: Collection[int] = ()) -> Iterator[dict[str, Any]]:
    """Each sustained rise in a log-norm series (NaN = missing point) whose onset is at or
    after step ``onset_min`` (the end of the run's warm-up), in order: onset, crossing and the
    levels it went through. ``batch``: the step of a batch that threw the run (loss_spike's
    batch event), if any; ``stages``: steps where the data changed (the first batch of a
    new input shape, where those are rare: _data.new_shape_steps)."""
    ok = np.isfinite(logn)
    step, x = step[ok], logn[ok]
    # A growth that runs into NaN/Inf within a few steps of the start has no warm-up to
    # skip and few points to show: 4 rising ones into a NaN are unmistakable.
    if not len(x):
        return
    short = ends_nonfinite and len(x) < th.min_points + th.warmup_steps
    keep = step >= (step[0] + (0 if short else th.warmup_steps))
    all_step, all_x = step, x
    step, x = step[keep], x[keep]
    if len(x) < (min(4, th.min_points) if short else th.min_points):
        return
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
    last = -1  # the previous episode's crossing: a next one rises from a minimum after it
    pending: dict[str, Any] | None = None  # an episode, told once the next one's onset is known
    for i in np.flatnonzero(rising):
        j = int(lo_at[i])
        if j <= last:
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
        # no calm level before the rise (nor before a jump: it is then one more steep step
        # of the rise, with no baseline to leave): dated from the run's start
        no_calm = j > 0 and slope > 0 and _no_calm_prefix(all_step, all_x, onset, th)
        if jump > j and not no_calm:  # dated to the jump, from the level before it;
            # crossed there at once
            onset, start_x, i = int(step[jump]), float(x[jump - 1]), max(i, jump)
            no_calm = _no_calm_prefix(all_step, all_x, onset, th)
        if no_calm:
            onset, start_x = int(all_step[0]), float(all_x[0])
            baseline = min(baseline, start_x)
        # a growth that reached its size only after a batch threw the run began with the
        # batch (bad batch -> spike -> explosion): before it, the series had not risen by
        # the factor from where the onset put it (an MoE expert's gradient drifting x2 while
        # its share of tokens grows, then knocked x5 up for 15 steps by the batch)
        if _reached_after(step, xs, j, onset, int(step[i]), batch, need):
            b = int(np.searchsorted(step, batch))
            onset, start_x, i = int(step[b]), float(x[b - 1]), max(i, b)
        # so, too, one that began where the data changed: it is the new data's (a longer
        # sequence's gradient), judged as such (gradient_explosion)
        stage = onset if onset in stages else next(
            (s for s in sorted(stages)
             if _reached_after(step, xs, j, onset, int(step[i]), s, need)), None)
        if stage is not None and stage != onset:
            b = int(np.searchsorted(step, stage))
            onset, start_x, i = int(step[b]), float(x[b - 1]), max(i, b)
        # what the growth did is read up to a batch that threw the run after its onset:
        # what followed the batch is the batch's doing (bad batch -> spike -> explosion), its
        # own episode; and up to the next episode's onset (below), which is that one's
        stop = len(xs)
        if batch is not None and onset < batch:
            b = int(np.searchsorted(step, batch))
            # unless the loss jumped at the culmination of a growth that had crossed before
            # it: still up since the crossing and at its peak within a few points of the
            # jump (a full-batch catapult: the norm x30 from step 280, peaking at 296, the
            # loss x2.4 at 297) — the growth's own consequence, not a batch from outside (a
            # level reached 70 steps earlier and held, noise and all, is no culmination: an
            # LR burst then is)
            if not _culminates(x, xs, i, b, baseline + need / 2, int(th.sustain)):
                stop = max(i + 1, b)
        if pending is not None:  # (a next onset placed back before its crossing: one
            # growth seen twice, its story runs on)
            at = int(np.searchsorted(step, onset))
            yield _story(pending, step, x, xs, ends_nonfinite, th, w,
                         min(pending["stop"], at) if at > pending["i"] else pending["stop"])
        pending = {"onset": onset, "cross": int(step[i]), "i": i, "lo": float(lo[i]),
                   "baseline": baseline, "start_x": start_x, "slope": float(slope),
                   "stop": stop, "stage": stage}
        last = i
    if pending is not None:
        yield _story(pending, step, x, xs, ends_nonfinite, th, w, pending["stop"])


def _reached_after(step: np.ndarray, xs: np.ndarray, j: int, onset: int, cross: int,
                   at: int | None, need: float) -> bool:
    """Did the growth from ``onset`` (index ``j``), crossing at step ``cross``, reach its size
    only after step ``at``: ``at`` within (onset, cross], and the level just before it had
    not risen by ``need`` above the level at the onset (levels, not points: each the median
    of LEVEL_PTS smoothed points; a noisy tensor's peak after a dip rises by the factor
    without any growth: a CNN's first bias, x40 step to step)."""
    if at is None or not onset < at <= cross:
        return False
    b = int(np.searchsorted(step, at))
    return 0 < b < len(xs) and float(np.median(xs[max(j, b - LEVEL_PTS):b])) - float(
        np.median(xs[max(0, j - LEVEL_PTS + 1):j + 1])) < need


def _story(ep: dict[str, Any], step: np.ndarray, x: np.ndarray, xs: np.ndarray,
           ends_nonfinite: bool, th: Thresholds, w: int, stop: int) -> dict[str, Any]:
    """An episode as its judges read it: what it did up to ``stop`` (the index where its
    story ends: a batch that threw the run, the next episode's onset, else the series' end;
    a rise that settled, then a learning-rate jump 30 steps later, is judged on where it
    settled, not on the later blow-up)."""
    i, baseline, need = ep["i"], ep["baseline"], math.log(float(th.factor))
    stop = max(i + 1, stop)
    # back down to (near) the baseline for the rest of its story: the rise ended
    down = xs[i:stop] <= baseline + need / 2
    after = np.flatnonzero(~down)
    settled = bool(down[-1]) and not (ends_nonfinite and stop == len(xs)) and \
        len(after) < len(down)
    # its level at the end (the last tenth, at least min_points): the same precision as
    # the loss's end it is compared with
    end = xs[max(i + 1, stop - max(int(th.min_points), stop // 10)):stop]
    return {"onset": ep["onset"], "cross": ep["cross"], "stage": ep.get("stage"),
            # still growing into the series' end (the first NaN, if any): its highest
            # point among the last few before it, and up since the crossing
            "into_end": bool(np.all(xs[i:] >= ep["lo"] + need / 2)
                             and int(np.argmax(xs)) >= len(xs) - max(3, w // 5)
                             and not _paused(xs[i:], need, w)),
            "settled_at": int(step[i + int(after[-1]) + 1]) if settled and len(after)
            else None, "from": float(math.exp(ep["start_x"])),
            "to": float(math.exp(x[i])), "per_step": float(math.exp(ep["slope"])),
            "max": float(math.exp(np.max(x[:stop]))), "baseline": float(math.exp(baseline)),
            # the level the growth held (smoothed: one batch's spike, a loss_spike's
            # business, is not a level any growth reached)
            "held": float(math.exp(np.max(xs[:stop]))),
            "end_level": float(math.exp(np.median(end))) if len(end) else None,
            "until": int(step[stop - 1])}


def _paused(rest: np.ndarray, need: float, w: int) -> bool:
    """Did a growth stop after its crossing before the series' end rose further: ``w``
    points in a row held their level (the medians of their two halves within a quarter of
    the rise test's factor: a growth of 5% a step moves them by half of it) a factor below
    where the series ended? Then what reached the end (a NaN, the run's highest point) is a later
    rise from that level, its own episode: a model whose gradients grew as it began to
    learn, held there for 70 steps, then blew up, did not blow up from its first rise."""
    if len(rest) < w + 1:
        return False
    top = float(np.max(rest))
    win = np.lib.stride_tricks.sliding_window_view(rest, w)
    h = w // 2
    held = np.abs(np.median(win[:, h:], axis=1) - np.median(win[:, :h], axis=1)) < need / 4
    flat = held & (win.max(axis=1) < top - need)
    return bool(flat.any())


def _no_calm_prefix(step: np.ndarray, x: np.ndarray, onset: int,
                    th: Thresholds) -> bool:
    """Was there no calm level before ``onset``: the log norms from the run's first point
    up to it (at least min_points) rise significantly (Mann–Kendall p < 0.01) at explosion
    speed (ln(factor) per ``window`` steps, the detector's own growth, or more; a model's
    norms drifting up while it learns rise ten times slower; a fast rise from a tiny
    initial level that then settled is no rate of the whole prefix: Theil–Sen's median
    slope is the calm part's)? A textbook explosion grows from step 0 (issue 45), and a
    noisy one (a 16-block residual MLP at too high an LR: the norm x3 up and down from step
    to step while its 20-step medians go 26 -> 650 -> 2e4) has no single point where a
    flat level turns into the rise: its change point is wherever the noise put the last dip
    (step 29 of a growth from step 1). The growth is then dated from the run's start."""
    pre = step < onset
    if int(pre.sum()) < int(th.min_points):
        return False
    z, p = _stats.mann_kendall(x[pre])
    rate, _ = _stats.theil_sen(step[pre].astype(float), x[pre])
    return z > 0 and p < 0.01 and rate >= math.log(float(th.factor)) / float(th.window)


def _culminates(x: np.ndarray, xs: np.ndarray, i: int, b: int, up: float, sustain: int
                ) -> bool:
    """Does the growth that crossed at index ``i`` culminate at ``b`` (where the loss
    jumped): ``b`` past its sustain points, the smoothed series ``xs`` above ``up`` from the
    crossing to ``b`` and at its peak within a few points of it, and the raw log norms ``x``
    still rising over that stretch (Mann–Kendall z > 0, p < 0.05: a growth going on, not a
    level it reached and holds)?"""
    if not (i + sustain < b < len(xs)) or not bool(np.all(xs[i:b + 1] >= up)):
        return False
    if i + int(np.argmax(xs[i:b + 1])) < b - sustain - 2:
        return False
    z, p = _stats.mann_kendall(x[i:b + 1])
    return z > 0 and p < 0.05


def first_real(eps: list[dict[str, Any]], real: Callable[[Mapping[str, Any]], bool],
               batch: int | None) -> dict[str, Any] | None:
    """The first of one series' episodes that is an explosion (``real``). Judged from the
    last back: a burst whose norms settled back to their baseline, followed by an episode
    that is no explosion either, is judged with its story running on through that one (and
    the ones it ran through): a flow or a GAN bursts again and again, each burst cutting the
    last one's story short of the steps where its loss had come back, and what a burst left
    shows once the later bursts, themselves harmless, are over. Never across a batch that
    threw the run (what follows it is the batch's)."""
    verdict = [False] * len(eps)
    for i in range(len(eps) - 1, -1, -1):
        ep = eps[i]
        if (i + 1 < len(eps) and not verdict[i + 1] and ep.get("settled_at") is not None
                and not (batch is not None and ep["onset"] < batch <= eps[i + 1]["until"])):
            ep["until"] = eps[i + 1]["until"]
        verdict[i] = real(ep)
    return next((ep for ep, v in zip(eps, verdict, strict=True) if v), None)
