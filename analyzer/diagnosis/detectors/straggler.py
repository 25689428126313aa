"""straggler: one rank is consistently slower than the others.

In synchronous data parallel training the ranks' step times equalise at the collective, so
the slow rank shows in what differs: its own step time when ranks are not synchronised, or
its data wait / the others' wait. Both are compared per step, rank against the median of
the other ranks.

From profiler traces of several ranks (``gpu.stragglers``): ranks that reach their
collectives late in most profiled steps. When the recorder's step times and the traces name
the same rank, one finding carries both.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ...gpu.gputime import has_trace_events
from ...gpu.memo import shared
from ...gpu.stragglers import collective_lateness, trace_stragglers
from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _data
from .base import Context

ID = "straggler"
NEEDS: tuple[str, ...] = ("step time",)
DEFAULTS: dict[str, Any] = {
    "warmup_steps": 3,
    "min_rel_slowdown": 0.2,   # rank's median step ≥ (1 + this) × the others' median
    "min_wait_share": 0.2,     # or its data wait exceeds the others' by this share of a step
    "min_consistency": 0.7,    # and it is slower on ≥ this share of the common steps
    "min_steps": 10,
    "min_late_share": 0.05,    # traces: reaches its collectives this share of a step late
    "min_trace_steps": 2,      # in ≥ min_consistency of at least this many profiled steps
    "min_late_z": 3.0,         # and (≥ 4 ranks) this many robust σ later than the ranks' median
}
DOC = {
    "meaning": "One rank is consistently slower than the others and holds everyone back.",
    "rule": "per common step, a rank's compute_s (batch arrival to last gradient, recorded "
            "on distributed runs), else duration_s, else data_wait_s vs the median of the other "
            "ranks: median slowdown ≥ min_rel_slowdown (or extra wait ≥ min_wait_share of the "
            "step) and slower on ≥ min_consistency of the steps. From traces of ≥ 2 ranks: "
            "per profiled step, how late a rank reaches its NCCL kernels (median duration "
            "over ranks − its own: the last to arrive waits least), as a share of the step: "
            "≥ min_late_share on ≥ min_consistency of ≥ min_trace_steps steps, and with ≥ 4 "
            "ranks ≥ min_late_z robust σ above the ranks' median.",
    "fixes": "Check that rank's host/GPU (thermal throttling, other jobs, slower node), its "
             "data shard (bigger samples, slow storage), uneven sharding, CPU affinity.",
}


def _aligned(per_rank: dict[int, dict[str, np.ndarray]], col: str, th: Thresholds
             ) -> tuple[list[int], np.ndarray, np.ndarray]:
    ranks = sorted(per_rank)
    common = None
    for r in ranks:
        d = per_rank[r]
        ok = np.isfinite(d[col]) & (d["step"] >= d["step"][0] + th.warmup_steps)
        s = d["step"][ok]
        common = s if common is None else np.intersect1d(common, s)
    if common is None or len(common) == 0:
        return ranks, np.empty(0, np.int64), np.empty((len(ranks), 0))
    m = np.empty((len(ranks), len(common)))
    for i, r in enumerate(ranks):
        d = per_rank[r]
        idx = np.searchsorted(d["step"], common)
        m[i] = d[col][idx]
    return ranks, common, m


def median_of_others(m: np.ndarray) -> np.ndarray:
    """``out[i, j]`` = median of column ``j`` without row ``i``, for all i at once: from one
    sort per column (a loop deleting each row is O(ranks² × steps): 3 s at 1,024 ranks)."""
    n = m.shape[0]
    s = np.sort(m, axis=0)
    pos = np.argsort(np.argsort(m, axis=0, kind="stable"), axis=0, kind="stable")

    def kth_without(k: int) -> np.ndarray:
        # the k-th smallest of the others: s[k] if row i sorts after k, else s[k + 1]
        return np.where(pos > k, s[min(k, n - 1)], s[min(k + 1, n - 1)])

    if (n - 1) % 2:
        return kth_without((n - 1) // 2)
    return 0.5 * (kth_without((n - 1) // 2 - 1) + kth_without((n - 1) // 2))


def _from_steps(ctx: Context, th: Thresholds) -> list[Finding]:
    per_rank = _data.steps(ctx)
    if len(per_rank) < 2:
        return []
    found = []
    # compute before the all-reduce first (synchronised DDP: step times are all equal),
    # then the step time itself (unsynchronised ranks)
    for col, what in (("compute_s", "compute before the gradient all-reduce"),
                      ("duration_s", "step time")):
        ranks, steps, dur = _aligned(per_rank, col, th)
        if len(steps) < th.min_steps:
            continue
        others_all = median_of_others(dur)
        for i, r in enumerate(ranks):
            others = others_all[i]
            slow = float(np.median(dur[i]) / max(np.median(others), 1e-12)) - 1
            consistent = float(np.mean(dur[i] > others))
            if slow >= th.min_rel_slowdown and consistent >= th.min_consistency:
                found.append((slow, r, what, consistent, float(np.median(dur[i])),
                              float(np.median(others)), steps))
        if found:
            break
    ranks_w, steps_w, wait = _aligned(per_rank, "data_wait_s", th)
    if len(steps_w) >= th.min_steps and not found:
        _, _steps_d, dur_w = _aligned(per_rank, "duration_s", th)
        step_med = float(np.median(dur_w)) if dur_w.size else 0.0
        others_w = median_of_others(wait)
        for i, r in enumerate(ranks_w):
            others = others_w[i]
            extra = float(np.median(wait[i] - others))
            consistent = float(np.mean(wait[i] > others))
            if step_med > 0 and extra / step_med >= th.min_wait_share \
                    and consistent >= th.min_consistency:
                found.append((extra / step_med, r, "data wait", consistent,
                              float(np.median(wait[i])), float(np.median(others)), steps_w))
    if not found:
        return []
    found.sort(reverse=True)
    rel, r, what, consistent, mine, theirs, steps = found[0]
    return [Finding(
        id=ID, severity="warning", subject=f"rank {r}", first_step=int(steps[0]),
        title=f"Rank {r} is a straggler ({what})",
        message=(f"Rank {r}'s median {what} is {1e3 * mine:.1f} ms vs {1e3 * theirs:.1f} ms "
                 f"on the other ranks (+{100 * rel:.0f}%), slower on "
                 f"{100 * consistent:.0f}% of {len(steps)} common steps."),
        advice=DOC["fixes"], chart=anchors.STEP_TIME,
        evidence={"rank": r, "metric": what, "median_s": mine, "others_median_s": theirs,
                  "relative": rel, "consistency": consistent,
                  "stragglers": sorted({x[1] for x in found})})]


def _from_traces(ctx: Context, th: Thresholds) -> list[dict[str, Any]]:
    if not has_trace_events(ctx.con):
        return []
    rows = shared(ctx.cache, ctx.con, collective_lateness)
    found = trace_stragglers(rows, min_late_share=float(th.min_late_share),
                             min_consistency=float(th.min_consistency),
                             min_z=float(th.min_late_z))
    return [s for s in found if s["steps"] >= int(th.min_trace_steps)]


def _trace_text(s: dict[str, Any]) -> str:
    return (f"it reaches its collectives {s['median_late_us'] / 1e3:.1f} ms late "
            f"({100 * s['median_late_share']:.0f}% of the step) in {s['late_steps']} of "
            f"{s['steps']} profiled steps, so every other rank waits for it there")


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    findings = _from_steps(ctx, th)
    traced = _from_traces(ctx, th)
    if not traced:
        return findings
    late_ranks = [s["rank"] for s in traced]
    for i, f in enumerate(findings):  # the recorder and the traces name the same rank
        s = next((x for x in traced if f"rank {x['rank']}" == f.subject), None)
        if s is not None:
            findings[i] = dataclasses.replace(
                f, message=f"{f.message} Its profiler traces agree: {_trace_text(s)}.",
                evidence={**f.evidence, "trace": s, "trace_stragglers": late_ranks})
            return findings
    s = traced[0]
    findings.append(Finding(
        id=ID, severity="warning", subject=f"rank {s['rank']}", first_step=s["first_step"],
        title=f"Rank {s['rank']} is a straggler (late at its collectives)",
        message=f"Rank {s['rank']} holds the job back: {_trace_text(s)}."
                + (f" Also late: ranks {', '.join(map(str, late_ranks[1:11]))}"
                   + (" …" if len(late_ranks) > 11 else "") + "." if len(late_ranks) > 1
                   else ""),
        advice=DOC["fixes"], chart=anchors.GPU_TIME,
        evidence={"rank": s["rank"], "metric": "collective lateness (traces)", "trace": s,
                  "stragglers": late_ranks, "trace_stragglers": late_ranks}))
    return findings
