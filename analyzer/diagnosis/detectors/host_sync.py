"""host_sync: the host blocks waiting for the GPU inside training steps.

Sync points found in the trace events of GPU traces (a CPU-only trace has none: there
``aten::item`` is a plain read):

* ``aten::_local_scalar_dense`` (what ``tensor.item()``, ``float(t)``, ``if t:`` and printing
  a CUDA tensor run) and ``aten::item`` ops that do not contain one;
* runtime calls ``cuda/hip{Device,Stream,Event}Synchronize``, and ``cudaMemcpy`` /
  ``hipMemcpy[WithStream]`` whose copy (same correlation) is device-to-host;
* any runtime call linked to a ``cuda_sync`` event (except ``Stream Wait Event``, which makes
  a stream wait, not the host).

A runtime call inside one of the ops above is part of it and is not counted again. With
ProfilerStep spans only syncs inside steps count (the profiler's own synchronisation when it
stops is outside them). Blocked time is the duration of the sync op or call on the host.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pyarrow as pa

from ...gpu.vocabulary import GPU_OR_LAUNCH_SQL, GPU_SIDE_SQL, LAUNCH_SQL, MEMCPY_SQL, SYNC_SQL
from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from .base import Context

ID = "host_sync"
NEEDS: tuple[str, ...] = ()
RANK_KEY = "blocked_pct"  # folded per rank on many-rank jobs by this (rank_groups)

DEFAULTS: dict[str, Any] = {
    # More sync points than this per profiled step is a warning (one .item() for logging
    # the loss is common and cheap enough).
    "max_syncs_per_step": 2.0,
    # Host blocked in syncs for more than this share of the profiled step time: warning.
    "max_blocked_pct": 5.0,
    # Sync sites listed in the evidence.
    "top_sites": 5,
}

DOC = {
    "meaning": "The host waits for the GPU (tensor.item(), printing a CUDA tensor, "
               "torch.cuda.synchronize(), device-to-host copies) inside training steps, so "
               "the GPU queue drains and the GPU idles.",
    "rule": "Per rank over GPU traces: syncs per profiled step above max_syncs_per_step or "
            "host time blocked in syncs above max_blocked_pct of step time → warning; any "
            "sync otherwise → info.",
    "fixes": "Keep losses/metrics on the GPU and read them every N steps; avoid .item(), "
             "print() and Python control flow on CUDA tensors in the step; use "
             "non_blocking=True copies to pinned memory.",
}

_SITES_SQL = f"""
WITH te AS (SELECT * FROM trace_events),
gpu_traces AS (
    SELECT rank, trace_id,
        count(DISTINCT name) FILTER (WHERE name LIKE 'ProfilerStep#%'
                                     AND cat NOT IN {GPU_SIDE_SQL})
            AS n_steps
    FROM te GROUP BY ALL
    HAVING bool_or(cat IN {GPU_OR_LAUNCH_SQL})
),
d2h AS (
    SELECT DISTINCT rank, trace_id, correlation FROM te
    WHERE cat = {MEMCPY_SQL} AND name LIKE 'Memcpy DtoH%' AND correlation IS NOT NULL
),
synced AS (
    SELECT DISTINCT rank, trace_id, correlation FROM te
    WHERE cat = {SYNC_SQL} AND name <> 'Stream Wait Event' AND correlation IS NOT NULL
)
SELECT te.rank, te.trace_id, te.step, te.cat, te.name, te.ts_us, te.dur_us, te.pid, te.tid,
       g.n_steps
FROM te
JOIN gpu_traces g ON g.rank = te.rank AND g.trace_id = te.trace_id
LEFT JOIN d2h ON d2h.rank = te.rank AND d2h.trace_id = te.trace_id
             AND d2h.correlation = te.correlation
LEFT JOIN synced sy ON sy.rank = te.rank AND sy.trace_id = te.trace_id
                   AND sy.correlation = te.correlation
WHERE (te.cat = 'cpu_op' AND te.name IN ('aten::_local_scalar_dense', 'aten::item'))
   OR (te.cat IN {LAUNCH_SQL} AND (
          regexp_matches(te.name, '^(cuda|hip)(Device|Stream|Event)Synchronize')
          OR (te.name IN ('cudaMemcpy', 'hipMemcpy', 'hipMemcpyWithStream')
              AND d2h.correlation IS NOT NULL)
          OR sy.correlation IS NOT NULL))
ORDER BY te.rank, te.trace_id, te.pid, te.tid, te.ts_us, te.dur_us DESC
"""

# Enclosing host spans of each site (same thread, start before, end after): the "stack".
_STACK_SQL = """
SELECT s.i, te.cat, te.name
FROM _host_sync_sites s
JOIN trace_events te
  ON te.rank = s.rank AND te.trace_id = s.trace_id AND te.pid = s.pid AND te.tid = s.tid
WHERE te.cat IN ('cpu_op', 'user_annotation', 'python_function')
  AND te.ts_us <= s.ts_us AND te.ts_us + te.dur_us >= s.ts_us + s.dur_us
  AND te.name NOT LIKE 'ProfilerStep#%'
  AND NOT (te.ts_us = s.ts_us AND te.dur_us = s.dur_us AND te.name = s.name)
ORDER BY s.i, te.ts_us, te.dur_us DESC
"""

_STEP_TIME_SQL = f"""
SELECT rank, count(DISTINCT (trace_id, name)) AS n, sum(dur_us) AS us
FROM trace_events
WHERE name LIKE 'ProfilerStep#%' AND cat NOT IN {GPU_SIDE_SQL}
GROUP BY rank
"""

_SPAN_SQL = f"""
SELECT rank, sum(span) FROM (
    SELECT rank, trace_id, max(ts_us + dur_us) - min(ts_us) AS span FROM trace_events
    WHERE cat NOT IN {GPU_SIDE_SQL}
    GROUP BY ALL)
GROUP BY rank
"""


def _within(inner: tuple, outer: tuple) -> bool:
    # rows: (rank, trace_id, step, cat, name, ts, dur, pid, tid, n_steps)
    return (
        inner[:2] == outer[:2] and inner[7:9] == outer[7:9]
        and outer[5] <= inner[5] and inner[5] + inner[6] <= outer[5] + outer[6]
    )


def _sites(rows: list[tuple]) -> list[tuple]:
    """Outermost sync rows only: a call inside _local_scalar_dense is part of it, and an
    aten::item counts only when it has no _local_scalar_dense inside (older traces)."""
    by_thread: dict[tuple, list[tuple]] = defaultdict(list)
    for r in rows:
        by_thread[(r[0], r[1], r[7], r[8])].append(r)
    out = []
    for rs in by_thread.values():
        dense = [r for r in rs if r[4] == "aten::_local_scalar_dense"]
        items = [r for r in rs if r[4] == "aten::item"]
        for r in rs:
            if r[4] == "aten::item":
                if not any(_within(d, r) for d in dense):
                    out.append(r)
            elif r[4] == "aten::_local_scalar_dense" or not any(
                _within(r, o) for o in dense + items
            ):
                out.append(r)
    return out


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    con = ctx.con
    rows = con.execute(_SITES_SQL).fetchall()
    if not rows:
        return []
    # Traces with ProfilerStep spans: only syncs inside a step count.
    rows = [r for r in rows if not r[9] or r[2] is not None]
    sites = _sites(rows)
    if not sites:
        return []
    max_per_step = float(th.max_syncs_per_step)
    max_blocked = float(th.max_blocked_pct)
    top_n = int(th.top_sites)

    stacks = _stacks(con, sites)
    step_time = {
        r[0]: (int(r[1]), float(r[2] or 0.0)) for r in con.execute(_STEP_TIME_SQL).fetchall()
    }
    span = {r[0]: float(r[1] or 0.0) for r in con.execute(_SPAN_SQL).fetchall()}

    per_rank: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(sites):
        per_rank[s[0]].append(i)

    findings = []
    for rank in sorted(per_rank):
        idx = per_rank[rank]
        blocked = sum(sites[i][6] for i in idx)
        n_steps, steps_us = step_time.get(rank, (0, 0.0))
        base_us = steps_us if n_steps else span.get(rank, 0.0)
        blocked_pct = round(100.0 * blocked / base_us, 2) if base_us > 0 else 0.0
        per_step = round(len(idx) / n_steps, 2) if n_steps else None
        groups: dict[tuple[str, str], dict[str, Any]] = {}
        for i in idx:
            label, caller, stack = stacks[i]
            g = groups.setdefault((label, stack), {
                "sync": label, "op": caller, "stack": stack, "count": 0, "blocked_us": 0.0,
                "first_step": None})
            g["count"] += 1
            g["blocked_us"] += sites[i][6]
            st = sites[i][2]
            if st is not None and (g["first_step"] is None or st < g["first_step"]):
                g["first_step"] = int(st)
        top = sorted(groups.values(), key=lambda g: (-g["blocked_us"], -g["count"]))[:top_n]
        for g in top:
            g["blocked_us"] = round(g["blocked_us"], 3)
        steps_seen = [sites[i][2] for i in idx if sites[i][2] is not None]
        first_step = int(min(steps_seen)) if steps_seen else None
        bad = (per_step is not None and per_step > max_per_step) or blocked_pct > max_blocked
        head = top[0]
        where = f" in {head['op']}" if head["op"] else ""
        count_txt = (f"{len(idx)} host syncs in {n_steps} profiled steps ({per_step:g} per step)"
                     if per_step is not None else f"{len(idx)} host syncs")
        findings.append(Finding(
            id=ID,
            severity="warning" if bad else "info",
            title=(f"Host waits for the GPU {per_step:g}× per step on rank {rank}"
                   if per_step is not None else f"Host waits for the GPU on rank {rank}"),
            message=(
                f"Rank {rank}: {count_txt}, blocking the host {blocked / 1e3:.2f} ms "
                f"({blocked_pct:.1f}% of the {'step' if n_steps else 'traced'} time). Most "
                f"blocking: {head['sync']}{where} ({head['count']}×, "
                f"{head['blocked_us'] / 1e3:.2f} ms)."
            ),
            first_step=first_step,
            subject=head["op"] or head["sync"],
            evidence={
                "rank": rank, "syncs": len(idx), "profiled_steps": n_steps,
                "syncs_per_step": per_step, "blocked_us": round(blocked, 3),
                "blocked_pct": blocked_pct, "sites": top,
                "max_syncs_per_step": max_per_step, "max_blocked_pct": max_blocked,
            },
            advice=(
                "Each sync drains the GPU queue. Keep values on the GPU and read them every N "
                "steps (accumulate the loss in a tensor; the recorder's rec.step(loss=...) "
                "reads it without a sync), avoid .item()/print()/Python if on CUDA tensors "
                "inside the step, and copy to the host with non_blocking=True into pinned "
                "memory."
            ),
            chart=anchors.PROFILER,
        ))
    return findings


def _stacks(con: Any, sites: list[tuple]) -> list[tuple[str, str | None, str]]:
    """Per site: (label, calling op, 'outer > ... > inner' stack of enclosing host spans)."""
    table = pa.table({
        "i": pa.array(range(len(sites)), pa.int64()),
        "rank": pa.array([s[0] for s in sites], pa.int32()),
        "trace_id": pa.array([s[1] for s in sites], pa.string()),
        "name": pa.array([s[4] for s in sites], pa.string()),
        "ts_us": pa.array([s[5] for s in sites], pa.float64()),
        "dur_us": pa.array([s[6] for s in sites], pa.float64()),
        "pid": pa.array([s[7] for s in sites], pa.int64()),
        "tid": pa.array([s[8] for s in sites], pa.int64()),
    })
    con.register("_host_sync_sites", table)
    try:
        frames: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for i, cat, name in con.execute(_STACK_SQL).fetchall():
            frames[i].append((cat, name))
    finally:
        con.unregister("_host_sync_sites")
    out = []
    for i, s in enumerate(sites):
        fr = frames.get(i, [])
        label = s[4]
        if label == "aten::_local_scalar_dense" and fr and fr[-1][1] == "aten::item":
            label = "aten::item"  # what the user wrote: tensor.item()
            fr = fr[:-1]
        # The calling op: innermost enclosing op that is not part of the sync itself.
        caller = next(
            (n for c, n in reversed(fr)
             if c in ("cpu_op", "user_annotation")
             and n not in ("aten::item", "aten::_local_scalar_dense")),
            None,
        )
        python = [n for c, n in fr if c == "python_function"]
        chain = python[-6:] if python else [n for _, n in fr][-6:]
        out.append((label, caller, " > ".join(chain)))
    return out
