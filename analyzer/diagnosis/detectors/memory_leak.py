"""memory_leak: the per-step memory floor keeps rising after warm-up.

Why the floor: memory within a step swings with activations and the allocator's caching;
the minimum over a window of steps is what survives every step, and a leak raises exactly
that. The slope is Theil–Sen (robust to a few spikes) over window floors, its significance a
Mann–Kendall test; a practical size threshold keeps tiny slow drifts out.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from ...stats import robust as _stats
from ...stats.fill import filling, new_keys
from ...stats.onset import along_line, into_warmup, regime_start, steady_onset
from ...units import fmt_bytes
from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _copies, _data
from ._profwin import discount, profiler_windows
from ._workset import (
    WORK_GROWTH,
    every_step_new,
    judge_without_shapes,
    shape_cache,
    shape_windows,
    share_with_work,
    work_series,
)
from .base import Context

ID = "memory_leak"
NEEDS: tuple[str, ...] = ("memory",)
ALIASES = ("leak",)
DEFAULTS: dict[str, Any] = {
    "warmup_frac": 0.1,          # skip this share of the steps (allocator/caches settle) ...
    "warmup_steps": 10,          # ... and at least this many steps
    "min_steps": 30,             # need this many memory samples after warm-up
    "windows": 50,               # number of step windows whose floor (min) is fitted
    "min_slope_bytes": 4096,     # ignore slopes below this many bytes per step ...
    "min_growth_bytes": 33554432,  # ... or a total floor growth below 32 MiB (RSS, CUDA) ...
    # heap_bytes (malloc in use) has no allocator caching: a steady rise is unambiguous at a
    # much smaller size. Healthy matrix runs (13 architectures, 6 healthy variants each)
    # drift ≤ 0.3 MiB over 300 steps, ~1 KiB a step, under min_slope_bytes; the graph a
    # small CNN's kept loss holds is ~14 KiB a step, 2.8 MiB over 200 steps.
    "min_growth_heap_bytes": 1048576,
    "min_growth_heap_frac": 0.005,
    "error_bytes_per_10k_steps": 1073741824,  # error when it would grow ≥ 1 GiB per 10k steps,
                                             # else warning (a slow leak)
    "min_growth_frac": 0.05,     # ... or below 5% of the starting floor
    "max_p": 0.001,              # Mann–Kendall p-value for a significant rise
    "tail_ratio": 0.3,           # still rising at the end: last-half slope ≥ this × slope
    # A cache fills at a falling rate (new keys get rarer: oneDNN's per-shape kernels under
    # bf16 autocast with dynamic shapes, a memo of a bounded dataset); a leak keeps its rate.
    # Growth over the last third of the analysed steps under this share of the first
    # third's is a fill. Matrix leaks: ≥ 0.64 (a warm-up fill inside the first third);
    # healthy fills (MoE + bf16 on CPU, growing 60-340 MiB over 300 steps): ≤ 0.19.
    "fill_ratio": 0.3,
}
DOC = {
    "meaning": "Memory that survives every step keeps growing (host heap in use, host RSS or "
               "CUDA allocated).",
    "rule": "Theil–Sen slope of the per-window memory floor after warm-up is positive, "
            "significant (Mann–Kendall p < max_p), still rising in the last half, not "
            "slowing down as a cache filling does (the last third's growth at least "
            "fill_ratio × the first third's) nor taking a cache's new keys (rises at few "
            "samples, at irregular gaps, ever rarer: stats/fill.new_keys), and the "
            "growth exceeds min_growth_bytes and min_growth_frac; projected steps to OOM when "
            "the device capacity is known. Host: heap_bytes net of the recorder's own rows "
            "buffered for its next flush (malloc in use: no allocator "
            "caching, so min_growth_heap_bytes) when it shows the leak, else RSS. Onset: where "
            "the rise that runs to the end begins (walking back from the end while the "
            "floors rise within a factor 2 of the last third's rate, a one-off step in the "
            "level taken out first — a lone window-to-window rise of over three windows of "
            "that rate, which a leak stepping every few windows never makes at once — then "
            "the onset engine's "
            "flat-then-rising fit from there): a warm-up that filled faster, or stopped, is "
            "not the leak's start; refined to the last step still at the level before it, "
            "or the step before its first steadily rising increment within two windows. "
            "The recorder's own profiler windows are discounted: their steps are skipped and "
            "the level the profiler kept (when it stands 3 robust sigmas out of the steps' "
            "own changes) is subtracted from what follows, until the recorder frees it (a "
            "fall of half that level that stays down for SETTLE steps, net of the trend: "
            "_profwin.py). "
            "Info, not a leak: a rise at least WORK_GROWTH of which comes where the work per "
            "step (tokens, else the step time) set a new high (the working set of longer "
            "sequences or larger images: _workset.py; unless the leak shows between new "
            "input shapes, below, where no step needs more than one before it), RSS "
            "growing while the heap in "
            "use, recorded beside it, shows no leak (pages the allocator keeps, or memory "
            "outside malloc), and growth that new input shapes explain: where the recorder "
            "counted the batches of new signature (steps.new_shapes), each interval between "
            "memory samples with one takes the trimmed mean change of the nearest intervals "
            "without one (at least QUIET of them), and the adjusted series is judged "
            "again; a leak left must also show over the runs of intervals free of new "
            "shapes, where a sample's noise (the live batch) telescopes: their rate since "
            "the onset SHOWN_Z standard errors above zero (σ·√runs / steps). No leak left: "
            "per-shape caches (oneDNN, cuDNN plans, recompiles), info; a leak left: its own "
            "rate, dated where those runs begin to rise (the least-squares hinge over their "
            "samples, each run, and each piece of one after a one-off change of ONE_OFF_Z = "
            "8 robust sigmas — beyond any noise's tail, where a buffer allocated or freed "
            "stood 25-37 — at its own level), not before the earlier of the raw and "
            "adjusted onsets, and that onset when the runs between them rose at half the "
            "rate beyond their noise or none lies between; before it, where the runs "
            "before it already rose so (the same hinge, searched up to it: both analyses "
            "start late when nearly every early step had a new shape). Nearly every step "
            "a new shape: nothing excused, said so. (Reasons and measurements of QUIET, "
            "NEIGHBOURS, TRIM, EVERY: _workset.py; SHOWN_Z, ONE_OFF_Z: _quiet.py.)",
    "fixes": "Don't keep tensors that hold the graph (use loss.item()/detach() for logging), "
             "clear caches/lists that grow per step, check DataLoader worker copies. On CPU "
             "with input shapes that change every step (variable graphs, token routing, "
             "dynamic padding), oneDNN keeps kernels per shape in a bounded cache "
             "(ONEDNN_PRIMITIVE_CACHE_CAPACITY, 1024 by default) that grows the heap until "
             "full: run a few hundred steps with ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 to tell.",
}
COUNTERS = ("heap_bytes", "rss_bytes", "cuda_allocated_bytes")
HOST = ("heap_bytes", "rss_bytes")  # one host finding: the heap's when it shows the leak


def _analyse(step: np.ndarray, val: np.ndarray, th: Thresholds,
             min_growth: float | None = None, min_frac: float | None = None,
             precise: bool = False, work: tuple[np.ndarray, np.ndarray, bool] | None = None
             ) -> dict[str, Any] | None:
    ok = np.isfinite(val)
    step, val = step[ok], val[ok]
    if len(step) < th.min_steps:
        return None
    skip = max(int(th.warmup_steps), int(len(step) * float(th.warmup_frac)))
    keep = step >= step[0] + skip
    s, v = step[keep], val[keep]
    if len(s) < th.min_steps:
        return None
    x, y = _stats.bucket_series(s.astype(np.float64), v, int(th.windows), how="min")
    if len(x) < 6:
        return None
    slope, _ = _stats.theil_sen(x, y)
    z, p = _stats.mann_kendall(y)
    growth = float(slope * (s[-1] - s[0]))
    start = float(np.median(y[:3]))
    half = len(x) // 2
    tail_slope, _ = _stats.theil_sen(x[half:], y[half:])
    bar = max(th.min_growth_bytes if min_growth is None else min_growth,
              (th.min_growth_frac if min_frac is None else min_frac) * max(start, 1.0))
    if not (slope >= th.min_slope_bytes and z > 0 and p < th.max_p and growth >= bar
            and tail_slope >= th.tail_ratio * slope
            and not filling(y, float(th.fill_ratio))
            and not new_keys(val, float(th.min_slope_bytes))):
        return None
    # onset: the change point of the window floors, where a level (flat, or the end of a
    # warm-up that filled and stopped) turns into the rise that lasts to the end (the onset
    # engine's best flat-then-rising fit). Not the first window above the starting level:
    # an allocator's bump or drop earlier in the run moves that level, not the leak's start.
    width = float(x[1] - x[0]) if len(x) > 1 else 1.0
    tau = regime_start(x, y)
    if tau is None:  # no steady final rise: the last floor at the starting level (within
        # a robust noise margin, or half a window's growth)
        margin = max(3 * _stats.mad_sigma(np.diff(y)), 0.5 * slope * width)
        at_start = np.flatnonzero(y <= start + margin)
        tau = int(at_start[-1]) if len(at_start) else 0
    # the leak's rate is its rate since it began: a flat stretch before a mid-run onset
    # would average it down (a 320 KiB-a-step leak from step 150 of 300 read as 200), and
    # the refinements below read a step as the leak's by that rate (read again below from
    # the refined onset)
    if len(x) - tau >= 4 and tau > 0:
        slope = max(slope, float(_stats.theil_sen(x[tau:], y[tau:])[0]))
    first = int(s[0])  # a rise from the analysed start has no level before it
    if tau > 0:
        # within a window of the change point, on the per-step values: the last step still at
        # the level before it (the level: the median of the two windows before the rise; at
        # it: within 3σ of its step-to-step noise, or half a leak step)
        lo_x = float(x[max(tau - 1, 0)])
        hi_x = float(x[min(tau + 2, len(x) - 1)]) if tau + 2 < len(x) else float(s[-1]) + 1
        pre = v[(s >= lo_x) & (s < float(x[tau]) + width)]
        level = float(np.median(pre)) if len(pre) else float(y[tau])
        sigma = _stats.mad_sigma(np.diff(pre)) if len(pre) > 2 else 0.0
        at = np.flatnonzero((s >= lo_x) & (s < hi_x) & (v <= level + max(3 * sigma, slope / 2)))
        first = int(s[at[-1]]) if len(at) else int(x[tau])
        # and, when the rise is steady step by step there (malloc'd bytes under a tensor leak),
        # the step before its first rising increment, taken within two windows of the level's
        # end: exact where a leak ramps up over a few steps or a one-off allocation just before
        # it lifted the level
        from_i = int(np.searchsorted(s, float(x[max(tau - 2, 0)])))
        steady = steady_onset(s[from_i:], v[from_i:], slope)
        if steady is not None and abs(steady - first) <= 2 * width:
            first = steady
    # (the rate since the refined onset)
    since = x >= first
    if since.sum() >= 4 and first > x[0]:
        slope = max(slope, float(_stats.theil_sen(x[since], y[since])[0]))
    if first <= int(s[0]) + 1:  # the leak runs from where the statistics begin
        back = min(into_warmup(step, val, first, slope),
                   along_line(step, val, first, slope))
        if back < first:  # its level and growth from there, as the message quotes them
            first, start = back, float(val[int(np.searchsorted(step, back))])
    else:  # "since step N ... from A to B": A is the level at N, not at the analysed start
        start = float(v[min(int(np.searchsorted(s, first)), len(v) - 1)])
    # the growth quoted is the message's own "from start to end"; it is the leak's, so it
    # must clear the bar itself (a one-off lift earlier in the run, malloc's 3 MiB arena at
    # one step, tilts the run's slope; what rises from the onset on is 60 KiB of noise)
    growth = max(float(y[-1]) - start, 0.0)
    if growth < bar:
        return None
    return {"slope": slope, "p": p, "growth": growth, "start": start, "end": float(y[-1]),
            "first_step": first, "last_step": int(s[-1]), "steps": len(s),
            "with_work": share_with_work(x, y, work) if work is not None else 0.0,
            "shapes": None}


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    cols = ctx.arrays(
        # the heap net of the recorder's own rows buffered for its next flush (they grow
        # for a flush interval and drop at the flush: a sawtooth of the recorder's, not the
        # training's; null in runs recorded before 2026-11-29)
        "SELECT rank, step, rss_bytes::DOUBLE AS rss_bytes, "
        "(heap_bytes - coalesce(recorder_heap_bytes, 0))::DOUBLE AS heap_bytes, "
        "cuda_allocated_bytes::DOUBLE AS cuda_allocated_bytes, "
        "cuda_total_bytes::DOUBLE AS cuda_total_bytes FROM memory "
        "WHERE step IS NOT NULL ORDER BY rank, step")
    if not len(cols["rank"]):
        return []
    slices = _data.rank_slices(cols["rank"])
    by_rank = {int(r): sel for r, sel in slices}

    out = []
    device_total = ((ctx.run.meta.get("device") or {}).get("total_memory_bytes"))
    windows = profiler_windows(ctx)
    host_found = False
    for counter in COUNTERS:
        if counter in HOST and host_found:
            continue
        best: tuple[int, dict[str, Any]] | None = None
        leaking = []
        heap = counter == "heap_bytes"
        min_growth = th.min_growth_heap_bytes if heap else None
        min_frac = th.min_growth_heap_frac if heap else None
        for r, sel in slices:
            vals = np.asarray(np.ma.filled(cols[counter][sel], np.nan), np.float64)
            steps = np.asarray(cols["step"][sel], np.int64)
            if windows.get(int(r)):
                steps, vals = discount(steps, vals, windows[int(r)])
            d = _data.steps(ctx).get(int(r))
            work = work_series(d) if d is not None else None
            res = _analyse(steps, vals, th, min_growth, min_frac, precise=heap, work=work)
            if res is None:
                continue
            shapes = shape_windows(d)
            if shapes is not None:  # (_workset.py: what new input shapes explain)
                judge_without_shapes(res, steps, vals, shapes, partial(_analyse, steps, th=th,
                                     min_growth=min_growth, min_frac=min_frac, precise=heap,
                                     work=work))
            leaking.append(int(r))
            if best is None or res["slope"] > best[1]["slope"]:
                totals = np.asarray(np.ma.filled(cols["cuda_total_bytes"][sel], np.nan))
                res["total"] = (float(np.nanmax(totals)) if np.isfinite(totals).any()
                                else (float(device_total) if device_total else None))
                best = (int(r), res)
        if best is None:
            continue
        r, res = best
        ev: dict[str, Any] = {
            "slope_bytes_per_step": round(res["slope"], 1),
            "growth_bytes": int(res["growth"]), "floor_start_bytes": int(res["start"]),
            "floor_end_bytes": int(res["end"]), "p_value": res["p"],
            "steps_analysed": res["steps"], "rank": r, "ranks_leaking": leaking,
        }
        severity = ("error" if res["slope"] * 10_000 >= th.error_bytes_per_10k_steps
                    else "warning")
        oom = ""
        if counter == "cuda_allocated_bytes" and res.get("total"):
            left = (res["total"] - res["end"]) / res["slope"]
            ev["capacity_bytes"] = int(res["total"])
            ev["projected_steps_to_oom"] = int(max(0.0, left))
            ev["projected_oom_step"] = int(res["last_step"] + max(0.0, left))
            oom = (f" At this rate the GPU ({fmt_bytes(res['total'])}) runs out in "
                   f"about {int(left):,} steps (step {ev['projected_oom_step']:,})."
                   if left >= 1 else
                   f" At this rate the GPU ({fmt_bytes(res['total'])}) is full by the run's "
                   f"last recorded step ({res['last_step']:,}).")
            if left <= res["steps"]:
                severity = "critical"
        host_found = host_found or counter in HOST
        what = {"rss_bytes": "host RSS", "heap_bytes": "host heap in use (malloc)",
                "cuda_allocated_bytes": "CUDA allocated memory"}[counter]
        ev["with_work_share"] = round(res["with_work"], 3)
        # (_workset.py: the working set, not a leak; unless the leak shows between new
        # input shapes, where no step needs more memory than one before it)
        shown = res["shapes"] is not None and not res["shapes"]["explained"]
        if res["with_work"] >= WORK_GROWTH and not shown:
            out.append(_working_set(counter, what, r, res, ev))
            continue
        if res["shapes"] is not None:  # (_workset.judge_without_shapes)
            ev.update(with_new_shapes_share=round(res["shapes"]["share"], 3),
                      growth_without_new_shapes_bytes=int(res["shapes"]["growth"]))
            if res["shapes"]["explained"]:
                out.append(shape_cache(ID, counter, what, r, res, ev))
                continue
        if counter == "rss_bytes" and _heap_recorded(cols["heap_bytes"][by_rank[int(r)]]):
            out.append(_outside_heap(r, res, ev))
            continue
        sel = by_rank[int(r)]
        copies = _copies.weight_copies(
            ctx.run.meta, np.asarray(cols["step"][sel], np.int64),
            np.asarray(np.ma.filled(cols[counter][sel], np.nan), np.float64),
            int(res["first_step"])) if counter != "cuda_allocated_bytes" else None
        if copies is not None:
            ev["weight_copies"] = copies
        out.append(Finding(
            id=ID, severity=severity, subject=counter, first_step=res["first_step"],
            title=f"{what} grows {fmt_bytes(res['slope'])} per step",
            message=(f"Since step {res['first_step']}, {what} on rank {r} grows by about "
                     f"{fmt_bytes(res['slope'])} every step and is still rising: from "
                     f"{fmt_bytes(res['start'])} to {fmt_bytes(res['end'])} "
                     f"(+{fmt_bytes(res['growth'])}). At this rate that is "
                     f"+{fmt_bytes(res['slope'] * 10_000)} per 10,000 steps."
                     + oom + every_step_new(res)
                     + (_copies.sentence(copies) if copies is not None else "")),
            advice=DOC["fixes"], evidence=ev, chart=anchors.MEMORY))
    return out


def _working_set(counter: str, what: str, r: int, res: dict[str, Any], ev: dict[str, Any]
                 ) -> Finding:
    """The info finding for memory that rose where the work per step reached new highs."""
    return Finding(
        id=ID, severity="info", subject=counter, first_step=res["first_step"],
        title=f"{what} grew with the work per step (its working set), not a leak",
        message=(f"{what} on rank {r} rose from {fmt_bytes(res['start'])} to "
                 f"{fmt_bytes(res['end'])}, {100 * res['with_work']:.0f}% of it where the "
                 "work per step reached a new high (longer sequences, larger images or "
                 "batches): the allocator keeps the largest step's memory. A leak grows "
                 "whatever the work."),
        advice="Nothing to fix if the work grows by design; if memory is tight, cap the "
               "largest batch (bucketing, a token budget).",
        evidence=ev, chart=anchors.MEMORY)


def _heap_recorded(heap: Any) -> bool:
    """Whether the rank's heap in use was recorded (glibc) for most of its samples."""
    v = np.asarray(np.ma.filled(heap, np.nan), np.float64)
    return bool(len(v)) and float(np.isfinite(v).mean()) > 0.8


def _outside_heap(r: int, res: dict[str, Any], ev: dict[str, Any]) -> Finding:
    """RSS growing while malloc's heap in use, recorded beside it, shows no leak: what a
    step keeps alive is allocated through malloc (tensors' storage, numpy arrays, Python
    containers' buffers and objects over 512 bytes), so a leak of them shows in the heap
    first; RSS alone grows with pages the allocator keeps after churn (fragmentation that
    levels off later) or memory outside malloc. Info: a symptom to watch, not a leak
    found."""
    ev["outside_heap"] = True
    return Finding(
        id=ID, severity="info", subject="rss_bytes", first_step=res["first_step"],
        title=f"host RSS grows {fmt_bytes(res['slope'])} per step while the heap in use "
              "does not",
        message=(f"Since step {res['first_step']}, host RSS on rank {r} grows by about "
                 f"{fmt_bytes(res['slope'])} a step ({fmt_bytes(res['start'])} to "
                 f"{fmt_bytes(res['end'])}), while the memory malloc has handed out and not "
                 "got back (tensors, arrays, Python containers) does not grow: pages the "
                 "allocator keeps after churn, which level off, or memory outside malloc "
                 "(many small Python objects, pinned buffers, a library's own mappings)."),
        advice="Run longer to see whether RSS levels off; MALLOC_ARENA_MAX=2 or "
               "MALLOC_TRIM_THRESHOLD_ reduce what glibc keeps; tracemalloc finds Python "
               "objects that accumulate.",
        evidence=ev, chart=anchors.MEMORY)
