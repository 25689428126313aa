"""host_sync: the host blocks waiting for the GPU inside training steps.

What a sync is, and where one is found, is :mod:`...gpu.syncs` (shared with ``gpu_idle``,
which weighs the idle time that began during one): the host **waiting** on the device, not
reading a number. ``aten::item`` on a CPU tensor (AdamW reads each parameter's CPU ``step``
that way) holds no device-to-host copy and no synchronize call, and is not one. Blocked time
is the duration of the sync op or call on the host.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pyarrow as pa

from ...gpu.memo import shared
from ...gpu.syncs import sync_sites
from ...gpu.vocabulary import GPU_SIDE_SQL
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
    "rule": "Per rank over GPU traces, a sync being a host wait on the device (a "
            "synchronize call, a blocking device-to-host copy, or an item()/_local_scalar_dense "
            "that holds one; a read of a CPU tensor is not): syncs per profiled step above "
            "max_syncs_per_step or host time blocked in syncs above max_blocked_pct of step "
            "time → warning; any sync otherwise → info.",
    "fixes": "Keep losses/metrics on the GPU and read them every N steps; avoid .item(), "
             "print() and Python control flow on CUDA tensors in the step; use "
             "non_blocking=True copies to pinned memory.",
}

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


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    con = ctx.con
    sites = shared(ctx.cache, con, sync_sites)
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
