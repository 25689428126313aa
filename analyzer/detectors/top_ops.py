"""top_ops: where the profiled time goes (always info).

Top CPU ops by self time (their span minus the ops and runtime calls directly inside them)
and by total time, and top GPU kernels by total time, over all ranks and traces.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import anchors
from ..findings import Finding
from ..gputime import gpu_time_breakdown
from ..trace_advice import recommendations
from ..trace_overview import CATEGORIES, step_overview

ID = "top_ops"

DEFAULTS: dict[str, Any] = {
    "top_n": 10,
}

DOC = {
    "meaning": "Where the profiled time goes: the CPU ops and GPU kernels that take longest.",
    "rule": "Always reported (info) when the run has trace events: top_n CPU ops by self and "
            "total time, top_n GPU kernels by total time.",
    "fixes": "Start optimising at the top of the list; big self time in a CPU op with little "
             "GPU time behind it means host overhead (fuse ops, torch.compile). The finding "
             "also carries the profiler plugin's step-time overview and whichever of its "
             "seven recommendations apply (data loader > 5% of the step, DataParallel, DDP "
             "without NCCL, communication > 10%, GPU busy < 50%, Tensor Cores unused, peak "
             "memory > 90%), each with its numbers.",
}

_HOST_TREE_SQL = """
SELECT rank, trace_id, pid, tid, cat, name, ts_us, dur_us
FROM trace_events
WHERE cat IN ('cpu_op', 'cuda_runtime', 'cuda_driver') AND dur_us IS NOT NULL
ORDER BY rank, trace_id, pid, tid, ts_us, dur_us DESC
"""

_KERNELS_SQL = """
SELECT name, count(*) AS n, sum(dur_us) AS total_us
FROM trace_events
WHERE cat IN ('kernel', 'gpu_memcpy', 'gpu_memset') AND dur_us IS NOT NULL
GROUP BY name ORDER BY total_us DESC
"""


def _self_times(con: Any) -> dict[str, list[float]]:
    """name -> [calls, total_us, self_us] of cpu_op events.

    Ops on one thread nest properly, so sorted by (thread, start, longest first) each event's
    parent is the nearest earlier event still open: a stack walk, one pass (cheap next to
    parsing; the GPU unions, which must scale, are the vectorised part).
    """
    rows = con.execute(_HOST_TREE_SQL).fetchall()
    if not rows:
        return {}
    thread = [r[:4] for r in rows]
    cats = [r[4] for r in rows]
    names = [r[5] for r in rows]
    ts = np.array([r[6] for r in rows], dtype=np.float64)
    dur = np.array([r[7] for r in rows], dtype=np.float64)
    end = ts + dur
    child = np.zeros(len(ts))
    stack: list[int] = []
    prev_thread = None
    for i in range(len(ts)):
        if thread[i] != prev_thread:
            stack.clear()
            prev_thread = thread[i]
        while stack and end[stack[-1]] < end[i]:
            stack.pop()
        if stack and end[stack[-1]] >= end[i] and ts[stack[-1]] <= ts[i]:
            child[stack[-1]] += dur[i]
        stack.append(i)
    out: dict[str, list[float]] = {}
    for i in range(len(ts)):
        if cats[i] != "cpu_op":
            continue
        acc = out.setdefault(names[i], [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += dur[i]
        acc[2] += max(dur[i] - child[i], 0.0)
    return out


def detect(ctx: Any, th: Mapping[str, Any]) -> list[Finding]:
    con = ctx.con
    n = int(th.get("top_n", DEFAULTS["top_n"]))
    ops = _self_times(con)
    kernels = con.execute(_KERNELS_SQL).fetchall()
    if not ops and not kernels:
        return []
    self_total = sum(v[2] for v in ops.values())
    kernel_total = sum(float(k[2]) for k in kernels)

    def op_row(name: str, v: list[float]) -> dict[str, Any]:
        return {"name": name, "calls": int(v[0]), "total_us": round(v[1], 3),
                "self_us": round(v[2], 3),
                "self_pct": round(100.0 * v[2] / self_total, 2) if self_total else 0.0}

    by_self = [op_row(k, v) for k, v in sorted(ops.items(), key=lambda kv: -kv[1][2])[:n]]
    by_total = [op_row(k, v) for k, v in sorted(ops.items(), key=lambda kv: -kv[1][1])[:n]]
    top_kernels = [
        {"name": name, "calls": int(cnt), "total_us": round(float(us), 3),
         "pct": round(100.0 * float(us) / kernel_total, 2) if kernel_total else 0.0}
        for name, cnt, us in kernels[:n]
    ]
    parts = []
    if by_self:
        o = by_self[0]
        parts.append(f"top CPU op by self time {o['name']} ({o['self_pct']:.1f}% of CPU op "
                     f"self time, {o['calls']} calls)")
    if top_kernels:
        k = top_kernels[0]
        parts.append(f"top GPU kernel {_short(k['name'])} ({k['pct']:.1f}% of GPU kernel "
                     f"time, {k['calls']} calls)")
    subject = top_kernels[0]["name"] if top_kernels else by_self[0]["name"]
    overview = _overview(ctx)
    recs = _recommendations(ctx, overview)
    if recs:
        parts.append("recommended: " + " ".join(r["message"] for r in recs).rstrip("."))
    return [Finding(
        id=ID,
        severity="info",
        title="Top ops: " + (_short(top_kernels[0]["name"]) if top_kernels
                             else by_self[0]["name"]),
        message="Profiled time: " + "; ".join(parts) + ".",
        subject=subject,
        evidence={"cpu_ops_by_self": by_self, "cpu_ops_by_total": by_total,
                  "gpu_kernels": top_kernels, "cpu_self_us": round(self_total, 3),
                  "gpu_kernel_us": round(kernel_total, 3),
                  "overview": overview, "recommendations": recs},
        advice=("Optimise from the top of these lists: a GPU kernel that dominates is the "
                "place for a better algorithm, precision (bf16/TF32) or fusion; a CPU op with "
                "large self time is host overhead (fuse ops, torch.compile, CUDA graphs)."),
        chart=anchors.PROFILER,
    )]


def _short(name: str, limit: int = 80) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def _cached(ctx: Any, key: str, compute: Any) -> Any:
    cached = getattr(ctx, "cached", None)
    return cached(key, compute) if cached is not None else compute()


def _overview(ctx: Any) -> dict[str, Any] | None:
    """The profiler plugin's overview over all ranks and profiled steps: each category's
    share of the step time (summed over steps, then over ranks)."""
    rows = _cached(ctx, "trace_overview.step_overview", lambda: step_overview(ctx.con))
    total = sum(r["total_us"] for r in rows)
    if not total:
        return None
    keys = [*CATEGORIES, "other"]
    return {"rank_steps": len(rows), "step_us": round(total / len(rows), 3),
            **{f"{k}_pct": round(100.0 * sum(r[f"{k}_us"] for r in rows) / total, 2)
               for k in keys}}


def _recommendations(ctx: Any, overview: dict[str, Any] | None) -> list[dict[str, Any]]:
    rows = _cached(ctx, "trace_overview.step_overview", lambda: step_overview(ctx.con))
    gpu = _cached(ctx, "gputime.gpu_time_breakdown", lambda: gpu_time_breakdown(ctx.con))
    return recommendations(ctx.con, rows, gpu)
