"""memory_leak's line between a leak and a working set that grew with the work (#45).

A curriculum that doubles the sequence length, a progressive image size or a batch longer
than any before raises what a step needs; the allocator (malloc's arenas, the OS's pages,
oneDNN's scratch) keeps that high-water mark, so the memory floor rises in a staircase whose
risers come where the work per step reached a new high. A leak grows at its own rate whatever
the work: its rises are spread over the run, and the few windows where the work sets a record
hold about their share of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...units import fmt_bytes
from .. import anchors
from ..findings import Finding
from ._quiet import SHOWN_Z, quiet_onset, quiet_rate, quiet_runs

RECORD = 0.1
"""A window sets a work record when its work exceeds every earlier window's by this share
(step-to-step noise of a steady loop's step time is a few per cent; a curriculum's stage is
1.5-4x)."""
WORK_GROWTH = 0.5
"""The floor's rise is the working set's when at least this share of it comes in or right
after a record window. A leak's share is about the share of windows that are records (on
the matrix's 150 leak runs at most 0.19: ~5 record windows of 50); the held-out curricula
(a TCN whose length doubles three times, a ViT 16->24->32 px) put 0.6-1.0 of their growth
there."""


def work_series(d: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, bool]:
    """(steps, work per step, by_tokens) from a rank's steps columns: the token count where
    the recorder has it for most steps (a window's work is then its largest batch), else
    the step time (then a window's median, so that a stall sets no record)."""
    step, dur = d["step"], d["duration_s"]
    tok = d["tokens_per_s"] * dur
    if np.isfinite(tok).mean() > 0.8:
        return step, tok, True
    return step, dur, False


def share_with_work(x: np.ndarray, y: np.ndarray, work: tuple[np.ndarray, np.ndarray, bool]
                    ) -> float:
    """The share of the floor series' rise (windows starting at ``x``, floors ``y``) that
    comes in a window where the work per step set a record, or in the window after it (a
    window's floor is its minimum: a riser inside it shows in the next one)."""
    step, val, by_tokens = work
    if len(x) < 3 or not np.isfinite(val).any():
        return 0.0
    edges = np.concatenate([x, [np.inf]])
    # the reference: the work before the analysed windows (past the first 3 steps, which
    # compile and tune)
    ok = np.isfinite(val) & (step >= (step[0] if len(step) else 0) + 3)
    pre = val[ok & (step < x[0])]
    top = float(np.max(pre) if by_tokens else np.median(pre)) if len(pre) else -np.inf
    rec = np.zeros(len(x), dtype=bool)
    for i in range(len(x)):
        seg = val[ok & (step >= edges[i]) & (step < edges[i + 1])]
        if not len(seg):
            continue
        w = float(np.max(seg) if by_tokens else np.median(seg))
        rec[i] = w > (1 + RECORD) * top
        top = max(top, w)
    rise = np.maximum(np.diff(y), 0.0)
    total = float(rise.sum())
    return float(rise[rec[1:] | rec[:-1]].sum() / total) if total > 0 else 0.0


QUIET = 0.25
"""The shape test needs at least this share of the memory samples' intervals (and 5) with
no new input shape in them: a leak's growth shows there at its own rate; without such
intervals (a loop whose every step is a new shape) nothing is excused."""


def shape_windows(d: dict[str, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps, new input shapes per step) where the recorder counted them for most steps
    (``steps.new_shapes``: training/shapes.py), else None."""
    if d is None or "new_shapes" not in d:
        return None
    n = d["new_shapes"]
    if not len(n) or np.isfinite(n).mean() < 0.8:
        return None
    return d["step"], n


NEIGHBOURS = 10
"""Intervals free of new shapes whose changes stand in for one with a new shape: the
nearest ones, so that a leak starting mid-run keeps its onset."""
TRIM = 2
"""... less the TRIM largest and smallest of them: one free or one allocation among the
neighbours (a 2 MB release of the heap beside a 113 KiB-a-step leak) is not the rate, and
imputed into every nearby interval with a new shape it would be counted many times over."""


def without_shapes(s: np.ndarray, v: np.ndarray, shapes: tuple[np.ndarray, np.ndarray]
                   ) -> tuple[np.ndarray, float] | None:
    """The memory series (steps ``s``, values ``v``) with what new input shapes explain
    taken out, and the share of its rise that came with them — or None without enough
    intervals free of new shapes (QUIET) to tell.

    A per-shape cache (oneDNN primitives, cuDNN plans, recompiles, a user's table per
    length) grows when a new shape arrives and holds otherwise; a leak grows at its own rate
    over every interval between two memory samples. Each interval in which the model met a
    new shape (from one sample's step to the next, both included: a shape met at a sample's
    step may be allocated after that sample was read) takes the mean change of the
    NEIGHBOURS nearest intervals without one (trimmed, TRIM): a cache then leaves a flat
    series, a leak its own growth, from where it began. A new shape's transient (a set
    transformer: +2.6 MB at a new size, freed two steps later) leaves a fall behind it; the
    onset rule of :func:`judge_without_shapes` keeps it from dating the leak."""
    step, new = shapes
    if len(s) < 3:
        return None
    met = np.sort(step[np.isfinite(new) & (new > 0)])
    # new shapes in [s[i-1], s[i]]: those up to each end minus those before each start
    near = np.searchsorted(met, s[1:], side="right") > np.searchsorted(met, s[:-1], side="left")
    quiet = np.flatnonzero(~near)
    if len(quiet) < max(5, QUIET * len(near)):
        return None
    # (raw values, not floors looking ahead: when the live batch's size, read with the heap,
    # swings more than a shape's rise, a floor moves that rise into the intervals before it)
    dv = np.diff(v)
    rise = np.maximum(dv, 0.0)
    total = float(rise.sum())
    share = float(rise[near].sum() / total) if total > 0 else 0.0
    out = dv.copy()
    half = NEIGHBOURS // 2
    for i in np.flatnonzero(near):
        at = int(np.searchsorted(quiet, i))
        lo = max(0, min(at - half, len(quiet) - NEIGHBOURS))
        near_by = np.sort(dv[quiet[lo:lo + NEIGHBOURS]])
        out[i] = float(np.mean(near_by[TRIM:len(near_by) - TRIM]))
    return np.concatenate([[v[0]], v[0] + np.cumsum(out)]), share


EVERY = 0.75
"""A share of steps with a new input shape at which the message says that nearly every step
brought one (then the intervals free of new shapes are too few to judge by, QUIET)."""


def judge_without_shapes(res: dict[str, Any], s: np.ndarray, v: np.ndarray,
                         shapes: tuple[np.ndarray, np.ndarray],
                         analyse: Callable[[np.ndarray], dict[str, Any] | None]) -> None:
    """Update ``res``, memory_leak's analysis of the series (``s``, ``v``), with what new
    input shapes explain: ``analyse`` judges the series without them (:func:`without_shapes`)
    — nothing left, or a growth that does not stand out of the noise over the intervals
    free of new shapes (``_quiet.py``), is a per-shape cache (``res["shapes"]["explained"]``);
    a leak left keeps its own rate, and its onset where the intervals free of new shapes
    begin to rise (not later than the raw series' onset when those between the two already
    rose at half the leak's rate, beyond their noise: a leak whose rate changed is no later
    leak)."""
    new = shapes[1]
    res["new_shape_steps"] = float(np.mean(new[np.isfinite(new)] > 0))
    adj = without_shapes(s, v, shapes)
    if adj is None:
        return
    left = analyse(adj[0])
    if left is None:
        res["shapes"] = {"share": adj[1], "explained": True,
                         "growth": float(adj[0][-1] - adj[0][0])}
        return
    # the onset: where the intervals free of new shapes begin to rise, not before the
    # earlier of the two analyses' onsets (the raw series holds the leak and the caches:
    # they can only date it earlier), and that onset itself when nothing free of new shapes
    # between the two says it was flat
    runs = quiet_runs(s, v, shapes)
    lo = min(int(res["first_step"]), int(left["first_step"]))
    first = quiet_onset(runs, lo, int(s[-1]))
    first = lo if first is None else first
    if first > lo:
        rate, se = quiet_rate(runs, lo, until=first)
        if not np.isfinite(se) or rate >= max(0.5 * left["slope"], SHOWN_Z * se):
            first = lo
    # and not after where the runs free of new shapes already rose at half the leak's rate,
    # beyond their noise: both analyses can start late where nearly every early step had a
    # new shape (a cache's jump of 70 steps' leak at step 36 dated a leak from step 0 at 36)
    early = quiet_onset(runs, int(s[0]), lo) if first == lo and lo > int(s[0]) else None
    if early is not None and early < lo:
        rate, se = quiet_rate(runs, early, until=lo)
        if np.isfinite(se) and rate >= max(0.5 * left["slope"], SHOWN_Z * se):
            first = early
    rate, se = quiet_rate(runs, first)  # (a leak must show there: SHOWN_Z)
    res["quiet_rate"] = (rate, se)
    res["shapes"] = {"share": adj[1], "explained": rate < SHOWN_Z * se,
                     "growth": float(adj[0][-1] - adj[0][0])}
    if not res["shapes"]["explained"]:
        res.update(slope=left["slope"], first_step=first)


def every_step_new(res: dict[str, Any]) -> str:
    """The leak message's note when nearly every step brought a new input shape."""
    share = res.get("new_shape_steps") or 0.0
    if share < EVERY:
        return ""
    return (f" {100 * share:.0f}% of the steps brought an input shape the model had not seen: "
            "a per-shape cache grows just like this until it is full (oneDNN keeps up to "
            "1,024 primitives on the CPU); a few hundred steps with "
            "ONEDNN_PRIMITIVE_CACHE_CAPACITY=0, or inputs padded to a few shapes, tell the two "
            "apart.")


def shape_cache(fid: str, counter: str, what: str, r: int, res: dict[str, Any], ev: dict[str, Any]
                 ) -> Finding:
    """The info finding for memory that rose where the model met new input shapes and
    held where it did not (:func:`without_shapes`)."""
    share, rest = res["shapes"]["share"], res["shapes"]["growth"]
    return Finding(
        id=fid, severity="info", subject=counter, first_step=res["first_step"],
        title=f"{what} grew with new input shapes (per-shape caches), not a leak",
        message=(f"{what} on rank {r} rose from {fmt_bytes(res['start'])} to "
                 f"{fmt_bytes(res['end'])}, {100 * share:.0f}% of it in windows where the "
                 "model met an input shape it had not seen; without those intervals it "
                 f"would have grown {fmt_bytes(max(rest, 0.0))}, which reads as no leak. "
                 "Kernels, plans and tables kept per shape "
                 "(oneDNN, cuDNN autotuning, recompilation, masks per length) grow until "
                 "the shapes recur; a leak grows with steps."),
        advice="Nothing to fix if the shapes vary by design; to bound it, bucket or pad "
               "the inputs to a few shapes (or cap oneDNN's cache with "
               "ONEDNN_PRIMITIVE_CACHE_CAPACITY).",
        evidence=ev, chart=anchors.MEMORY)
