"""top_ops: where the profiled time goes (always info).

Top CPU ops by self time (their span minus the ops and runtime calls directly inside them)
and by total time, and top GPU kernels by total time, over all ranks and traces.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...gpu.advice import recommendations
from ...gpu.gputime import gpu_time_breakdown
from ...gpu.memo import shared
from ...gpu.overview import CATEGORIES, step_overview
from ...gpu.vocabulary import GPU_ACTIVITY_SQL, LAUNCH, sql_in
from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from .base import Context

ID = "top_ops"
NEEDS: tuple[str, ...] = ()

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

_HOST_TREE_SQL = f"""
SELECT rank, trace_id, pid, tid, cat, name, ts_us, dur_us
FROM trace_events
WHERE cat IN {sql_in(("cpu_op", *LAUNCH))} AND dur_us IS NOT NULL
ORDER BY rank, trace_id, pid, tid, ts_us, dur_us DESC
"""

_KERNELS_SQL = f"""
SELECT name, count(*) AS n, sum(dur_us) AS total_us
FROM trace_events
WHERE cat IN {GPU_ACTIVITY_SQL} AND dur_us IS NOT NULL
GROUP BY name ORDER BY total_us DESC
"""


def _self_times(con: Any) -> dict[str, list[float]]:
    """name -> [calls, total_us, self_us] of cpu_op events.

    Ops on one thread nest properly, so sorted by (thread, start, longest first) each event's
    parent is the nearest earlier event still open: a stack walk, one pass (cheap next to
    parsing; the GPU unions, which must scale, are the vectorised part).
    """
    cols = con.execute(_HOST_TREE_SQL).fetchnumpy()
    if not len(cols["ts_us"]):
        return {}
    # one thread key per row, as ints: comparing tuples of four would double the loop's cost
    key = np.stack([np.ma.filled(cols[c], -1).astype(np.int64) for c in ("rank", "pid", "tid")]
                   + [np.unique(np.asarray(cols["trace_id"], dtype=object),
                                return_inverse=True)[1]])
    new_thread = np.r_[True, (key[:, 1:] != key[:, :-1]).any(axis=0)].tolist()
    ts = np.asarray(cols["ts_us"], dtype=np.float64)
    dur_a = np.asarray(cols["dur_us"], dtype=np.float64)
    # plain lists in the loop: indexing numpy arrays element by element is ~3x slower
    start, dur, end = ts.tolist(), dur_a.tolist(), (ts + dur_a).tolist()
    child = [0.0] * len(start)
    stack: list[int] = []
    for i in range(len(start)):
        if new_thread[i]:
            stack.clear()
        e = end[i]
        while stack and end[stack[-1]] < e:
            stack.pop()
        if stack and start[stack[-1]] <= start[i]:
            child[stack[-1]] += dur[i]
        stack.append(i)
    is_op = np.asarray(cols["cat"], dtype=object) == "cpu_op"
    names = np.asarray(cols["name"], dtype=object)[is_op]
    self_us = np.maximum(dur_a - np.asarray(child), 0.0)[is_op]
    uniq, inv = np.unique(names, return_inverse=True)
    calls = np.bincount(inv, minlength=len(uniq))
    total = np.bincount(inv, weights=dur_a[is_op], minlength=len(uniq))
    own = np.bincount(inv, weights=self_us, minlength=len(uniq))
    return {str(n): [int(c), float(t), float(o)]
            for n, c, t, o in zip(uniq, calls, total, own, strict=True)}


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    con = ctx.con
    n = int(th.top_n)
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


def _overview(ctx: Context) -> dict[str, Any] | None:
    """The profiler plugin's overview over all ranks and profiled steps: each category's
    share of the step time (summed over steps, then over ranks)."""
    rows = shared(ctx.cache, ctx.con, step_overview)
    total = sum(r["total_us"] for r in rows)
    if not total:
        return None
    keys = [*CATEGORIES, "other"]
    return {"rank_steps": len(rows), "step_us": round(total / len(rows), 3),
            **{f"{k}_pct": round(100.0 * sum(r[f"{k}_us"] for r in rows) / total, 2)
               for k in keys}}


def _recommendations(ctx: Context, overview: dict[str, Any] | None) -> list[dict[str, Any]]:
    cache = ctx.cache
    rows = shared(cache, ctx.con, step_overview)
    gpu = shared(cache, ctx.con, gpu_time_breakdown)
    return recommendations(ctx.con, rows, gpu)
