"""cuda_oom: a CUDA out-of-memory error, diagnosed as what it is — and the allocator's
warnings before one (allocation retries, reserved ≫ allocated).

An OOM means one request did not fit in what the device had free. Why decides the fix, and
the evidence tells the causes apart, in this order:

1. ``request_exceeds_device`` — the request alone is larger than the whole device: no batch
   size, checkpointing or allocator setting fits it. A size bug (a shape, a dtype, a
   mis-multiplied buffer).
2. ``fragmentation`` — the allocator held at least the request in reserved-but-unallocated
   blocks, none large enough: the memory was there, in pieces
   (``expandable_segments:True``).
3. ``leak`` — memory retained from step to step grew by at least the shortfall (request −
   free): without that growth the request would have fit. Read from the per-step memory rows
   (a robust slope, growing across the steps before the OOM), or, where the rows cannot date
   it, from the allocator snapshot's live allocations made in several different steps by
   one line of code.
4. ``capacity`` — none of the above, with the growth checked: the step's working set (model,
   optimizer state, activations) does not fit. Batch, sequence length, activation
   checkpointing, mixed precision, sharding.
5. ``unknown`` — the message holds no numbers and nothing else tells.

A CUDA OOM that ends training is an error (the crash is its consequence); one the script
caught and survived (the allocator's ``num_ooms`` rose, no exception ended the run) is a
warning. Runs recorded before the counters were read at each step's end (no
``cuda_max_allocated_bytes`` column) have their counters dated by the writer's flush: they
are used only as totals, never to date or to measure growth.

Formerly ``cuda_fragmentation`` (still accepted by ``--set`` and ``--fail-on``; the JSON
finding carries ``former_id`` for one release).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...stats import robust as _stats
from ...stats.onset import steady_onset
from ...units import fmt_bytes
from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _oom
from .base import Context

ID = "cuda_oom"
NEEDS: tuple[str, ...] = ("memory",)
ALIASES = ("oom",)  # (and its former id, cuda_fragmentation: findings.FORMER_IDS)
DEFAULTS: dict[str, Any] = {
    "max_reserved_ratio": 2.0,      # no OOM: median reserved / allocated above this ...
    "min_gap_bytes": 1073741824,    # ... with at least 1 GiB reserved but unused: fragmented
    "max_retries": 0,               # more alloc retries than this → warning
    "min_growth_steps": 3,          # a leak shows over at least this many steps
    "max_growth_p": 0.01,           # Mann–Kendall p of the end-of-step rise (≥ 8 steps)
}
DOC = {
    "meaning": "A CUDA out-of-memory error and its cause (request larger than the device, "
               "fragmentation, a leak into the capacity, or the working set), or the "
               "allocator's warnings before one.",
    "rule": "From the OOM message's numbers, the per-step memory rows and the allocator "
            "snapshot: request > device total → request_exceeds_device; reserved-but-"
            "unallocated ≥ request → fragmentation; memory retained across ≥ "
            "min_growth_steps steps grew by ≥ the shortfall (request − free) → leak; else "
            "capacity (unknown without numbers). Without an OOM: alloc retries > max_retries, "
            "or median reserved/allocated > max_reserved_ratio with ≥ min_gap_bytes unused.",
    "fixes": "request_exceeds_device: check the shape/dtype of the failing allocation. "
             "fragmentation: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, steady shapes. "
             "leak: stop keeping tensors across steps (detach/.item() for logs, bounded "
             "caches). capacity: smaller batch or sequence, activation checkpointing, bf16, "
             "a fused/8-bit optimizer, FSDP.",
}
_FIXES = {
    "request_exceeds_device": "The request alone exceeds the device: look at the shape and "
                              "dtype of the allocation in the stack (a size bug), not at "
                              "the batch size.",
    "fragmentation": "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; keep tensor "
                     "shapes steady (pad or bucket sequence lengths); free large "
                     "temporaries early.",
    "leak": "Find what keeps tensors from step to step (a list or cache that never evicts, "
            "a logged loss kept with its graph: use .detach()/.item()).",
    "capacity": "The step's working set does not fit: smaller batch or sequence length, "
                "activation checkpointing, bf16 autocast, a lighter optimizer state, or "
                "sharding (FSDP).",
    "unknown": DOC["fixes"],
}


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    out = []
    per_step = _oom.rows_are_per_step(ctx)
    crashed = {}
    for oom in _oom.ooms(ctx):
        crashed[oom.rank] = oom
        out.append(_diagnose(ctx, th, oom, per_step))
    for row in _counter_rows(ctx):
        if row["rank"] not in crashed:
            f = _warning(th, row, per_step)
            if f is not None:
                out.append(f)
    return out


def _diagnose(ctx: Context, th: Thresholds, oom: _oom.Oom, per_step: bool) -> Finding:
    n = dict(oom.numbers)
    snap = _oom.snapshot(ctx, oom.rank)
    trace_oom = ((snap or {}).get("trace") or {}).get("oom") or {}
    request = n.get("request_bytes") or trace_oom.get("size")
    total = n.get("total_bytes") or oom.counters.get("cuda_total_bytes")
    free = n.get("free_bytes", trace_oom.get("device_free"))
    unalloc = n.get("reserved_unallocated_bytes")
    if unalloc is None and oom.counters.get("cuda_reserved_bytes") is not None:
        unalloc = oom.counters["cuda_reserved_bytes"] - (oom.counters.get(
            "cuda_allocated_bytes") or 0)
    shortfall = request - free if request is not None and free is not None else request
    growth, checked = _growth(ctx, th, oom, per_step, snap)
    cause = cause_of(request, total, unalloc, shortfall, growth, checked)
    if cause == "request_exceeds_device":
        why = (f"one request of {fmt_bytes(request)} is larger than the whole device "
               f"({fmt_bytes(total)}): a size bug, not fragmentation or a leak")
    elif cause == "fragmentation":
        why = (f"{fmt_bytes(unalloc)} was reserved but unallocated, at least the "
               f"{fmt_bytes(request)} asked, yet no block was large enough: fragmentation")
    elif cause == "leak":
        why = (f"memory kept from step to step grew by {fmt_bytes(growth['per_step'])} a "
               f"step from {'about ' if growth.get('onset_estimated') else ''}step "
               f"{growth['onset_step']} ({fmt_bytes(growth['bytes'])} in all"
               f"{_where(growth)}) and ran into the capacity: without it the "
               f"{fmt_bytes(request)} would have fit")
    elif cause == "capacity":
        why = (f"the device ({fmt_bytes(total)}) was full with what the step needs"
               + (f" ({fmt_bytes(n['allocated_bytes'])} allocated by PyTorch)"
                  if n.get("allocated_bytes") else "")
               + ("; memory did not grow from step to step" if growth is None else ""))
    else:
        why = ("the error states no sizes" if request is None or total is None else
               "whether memory grew from step to step cannot be told: this run's memory rows "
               "were read when the writer flushed (recorded before 2026-11-27), and no "
               "allocator history was kept (knob memory_history)")
    step = oom.step
    title = {"request_exceeds_device": "a request larger than the device",
             "fragmentation": "fragmentation", "leak": "a leak ran into the capacity",
             "capacity": "the working set does not fit", "unknown": "cause unknown"}[cause]
    ev: dict[str, Any] = {
        "rank": oom.rank, "cause": cause, "step": step, "request_bytes": request,
        "total_bytes": total, "free_bytes": free, "reserved_unallocated_bytes": unalloc,
        "allocated_bytes": n.get("allocated_bytes"), "oom": True,
        "growth": growth, "counters_per_step": per_step,
    }
    if n.get("process_bytes") and total and free is not None:
        other = total - free - n["process_bytes"]
        if other > 0:
            ev["other_processes_bytes"] = other
    if snap is not None:
        ev["snapshot"] = _snapshot_evidence(snap)
    return Finding(
        id=ID, severity="error", subject="cuda_allocated_bytes", first_step=(
            growth["onset_step"] if cause == "leak" and growth else step),
        title=f"CUDA out of memory on rank {oom.rank} at step {step}: {title}",
        message=f"The CUDA allocator could not satisfy a request at step {step}: {why}.",
        advice=_FIXES[cause], evidence=ev, chart=anchors.MEMORY)


def cause_of(request: int | None, total: int | None, unalloc: int | None,
             shortfall: int | None, growth: dict[str, Any] | None, checked: bool) -> str:
    """The module docstring's order: the request against the device, then against the free
    reserved memory, then the growth against the shortfall; capacity only once growth was
    checked."""
    if request is not None and total is not None and request > total:
        return "request_exceeds_device"
    if request is not None and unalloc is not None and unalloc >= request:
        return "fragmentation"
    if growth is not None and shortfall is not None and growth["bytes"] >= shortfall:
        return "leak"
    if request is not None and total is not None and checked:
        return "capacity"
    return "unknown"


def _where(growth: dict[str, Any]) -> str:
    return f", from {growth['frame']}" if growth.get("frame") else ""


def _growth(ctx: Context, th: Thresholds, oom: _oom.Oom, per_step: bool,
            snap: dict[str, Any] | None) -> tuple[dict[str, Any] | None, bool]:
    """(memory retained from step to step before the OOM, or None; whether that could be
    checked at all). From the per-step rows (robust slope; a rise through the steps, not the
    first step's optimizer state), else from the snapshot's live allocations made in ≥
    min_growth_steps different steps by one line. An OOM in the first steps has had no room
    to leak: checked."""
    early = oom.step is not None and oom.step < th.min_growth_steps
    if per_step:
        steps, vals = _oom.allocated_series(ctx, oom.rank, oom.step)
        if len(steps) >= th.min_growth_steps:
            s, v = np.asarray(steps, float), np.asarray(vals, float)
            slope, _ = _stats.theil_sen(s, v)
            rising = np.diff(v)
            steady = len(v) < 8 and bool(np.all(rising >= 0)) and int(
                np.sum(rising > 0)) >= th.min_growth_steps - 1
            if slope > 0 and (steady or _stats.mann_kendall(v)[1] < th.max_growth_p):
                onset = steady_onset(s, v, slope)
                i = int(np.searchsorted(s, onset)) if onset is not None else int(np.argmin(v))
                return {"source": "memory rows", "per_step": float(slope),
                        "onset_step": int(s[i]), "bytes": float(v[-1] - v[i])}, True
            return None, True
        return None, early
    history = bool(((snap or {}).get("trace") or {}).get("entries"))
    return _snapshot_growth(ctx, th, oom, snap), history or early


def _snapshot_growth(ctx: Context, th: Thresholds, oom: _oom.Oom,
                     snap: dict[str, Any] | None) -> dict[str, Any] | None:
    """Allocations still live at the OOM, made by one line with one size in several
    different steps (the allocator's history, dated by the steps' end times): memory kept
    step after step. The history is a ring buffer; when the snapshot's blocks hold more live
    memory from that line than the history saw, the earliest allocations left it, and the
    onset is estimated back from the rate (``onset_estimated``)."""
    groups = ((snap or {}).get("trace") or {}).get("repeated_allocations") or []
    ends = ctx.rows("SELECT step, time FROM steps WHERE rank = ? AND time IS NOT NULL "
                    "ORDER BY step", [oom.rank])
    if not groups or not ends:
        return None
    step_no = np.asarray([s for s, _ in ends])
    end_us = np.asarray([t for _, t in ends], float) * 1e6
    live = {g.get("frame"): g for g in (snap or {}).get("live_by_frame") or []}
    best = None
    for g in groups:
        times = np.asarray(g.get("times_us") or [], float)
        if not len(times):
            continue
        # an allocation belongs to the first step whose end is not before it
        idx = np.minimum(np.searchsorted(end_us, times), len(step_no) - 1)
        in_steps = sorted({int(step_no[i]) for i in idx})
        if len(in_steps) < th.min_growth_steps:
            continue  # made in one or two steps: the model, its optimizer state
        seen = float(g.get("bytes") or 0)
        per_step = seen / (in_steps[-1] - in_steps[0] + 1)
        held = float((live.get(g.get("frame")) or {}).get("bytes") or 0)
        total, onset = max(seen, held), in_steps[0]
        if held > seen and per_step > 0:  # the history lost the first ones
            onset = max(int(step_no[0]), in_steps[-1] - round(total / per_step) + 1)
        cand = {"source": "allocator snapshot", "frame": g.get("frame"), "bytes": total,
                "per_step": per_step, "onset_step": onset, "onset_estimated": held > seen,
                "steps": len(in_steps), "size": g.get("size"), "allocations": g.get("count")}
        if best is None or cand["bytes"] > best["bytes"]:
            best = cand
    return best


def _snapshot_evidence(snap: dict[str, Any]) -> dict[str, Any]:
    if "error" in snap:
        return {"file": snap.get("file"), "error": snap["error"]}
    trace = snap.get("trace") or {}
    return {"file": snap.get("file"), "segments": snap.get("segments"),
            "live_by_frame": snap.get("live_by_frame") or [],
            "repeated_allocations": [{k: v for k, v in g.items() if k != "times_us"}
                                     for g in trace.get("repeated_allocations") or []],
            "history_entries": trace.get("entries", 0)}


def _counter_rows(ctx: Context) -> list[dict[str, Any]]:
    rows = ctx.rows(
        """
        SELECT rank,
               median(cuda_reserved_bytes::DOUBLE / nullif(cuda_allocated_bytes, 0)),
               median(cuda_reserved_bytes - cuda_allocated_bytes),
               max(cuda_alloc_retries) - min(cuda_alloc_retries),
               max(cuda_ooms) - min(cuda_ooms),
               min(step) FILTER (WHERE cuda_alloc_retries > 0),
               min(step) FILTER (WHERE cuda_ooms > 0),
               min(step) FILTER (WHERE cuda_reserved_bytes > 0),
               max(cuda_reserved_bytes)
        FROM memory WHERE cuda_reserved_bytes IS NOT NULL OR cuda_alloc_retries IS NOT NULL
        GROUP BY rank ORDER BY rank
        """)
    keys = ("rank", "ratio", "gap", "retries", "ooms", "first_retry", "first_oom",
            "first_step", "max_reserved")
    return [dict(zip(keys, r, strict=True)) for r in rows]


def _warning(th: Thresholds, row: dict[str, Any], per_step: bool) -> Finding | None:
    r, ratio, gap, retries = row["rank"], row["ratio"], row["gap"], row["retries"]
    ev = {"rank": r, "median_reserved_over_allocated": ratio, "median_gap_bytes": gap,
          "alloc_retries": retries, "ooms": row["ooms"], "max_reserved_bytes":
          row["max_reserved"], "counters_per_step": per_step}
    fragmented = bool(ratio and gap and ratio > th.max_reserved_ratio
                      and gap >= th.min_gap_bytes)
    # (old runs' counters are the flush's: their first step says nothing)
    when = (lambda s: s) if per_step else (lambda s: None)
    if row["ooms"]:
        return Finding(
            id=ID, severity="warning", subject="cuda_ooms", first_step=when(row["first_oom"]),
            title=f"{row['ooms']} CUDA out-of-memory error(s) caught on rank {r}",
            message=(f"The CUDA allocator raised {row['ooms']} OOM(s) on rank {r} that the "
                     "script caught (training went on): each frees the cache and retries."),
            advice=_FIXES["fragmentation" if fragmented else "capacity"],
            evidence={**ev, "cause": "fragmentation" if fragmented else "capacity"},
            chart=anchors.MEMORY)
    if retries and retries > th.max_retries:
        return Finding(
            id=ID, severity="warning", subject="cuda_alloc_retries",
            first_step=when(row["first_retry"]),
            title=f"{retries} CUDA allocation retries on rank {r}",
            message=(f"The caching allocator ran out of cached memory, freed its cache and "
                     f"retried {retries} allocation(s) on rank {r}: each retry synchronises "
                     "and slows the step, and the next may be an OOM."
                     + (f" Reserved/allocated ≈ {ratio:.1f}." if ratio else "")),
            advice=_FIXES["fragmentation" if fragmented else "capacity"],
            evidence={**ev, "cause": "fragmentation" if fragmented else "capacity"},
            chart=anchors.MEMORY)
    if fragmented:
        return Finding(
            id=ID, severity="warning", subject="cuda_reserved_bytes",
            first_step=when(row["first_step"]),
            title=f"CUDA memory fragmented on rank {r} (reserved {ratio:.1f}× allocated)",
            message=(f"Rank {r} keeps {fmt_bytes(gap)} reserved but unallocated "
                     f"(median reserved/allocated {ratio:.1f})."),
            advice=_FIXES["fragmentation"], evidence={**ev, "cause": "fragmentation"},
            chart=anchors.MEMORY)
    return None
