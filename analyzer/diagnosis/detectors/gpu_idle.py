"""gpu_idle: the GPU sits idle for a large share of the profiled time.

Uses the HTA-compatible breakdown of ``gputime`` (idle = time between the first and the last
GPU activity of a trace when nothing runs on any stream: no kernel, memcpy, memset or
device sync, as HTA counts them). One finding per
rank whose idle share is above ``max_idle_pct``, with the cause the trace supports
(``evidence.cause``, :mod:`...gpu.idle_cause`): ``host_sync`` only when the idle time began
while the host waited in a sync, ``input_bound`` when data loading accounts for it,
``launch_bound`` when the host cannot launch kernels as fast as the GPU runs them, else
``unknown``. Causality links it to ``host_sync`` or ``dataloader_bottleneck`` only when that
is its cause.
"""

from __future__ import annotations

from typing import Any

from ...gpu.gputime import gpu_time_breakdown, gpu_time_by_step
from ...gpu.idle_cause import idle_causes
from ...gpu.memo import shared
from ...gpu.syncs import sync_sites
from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from .base import Context

ID = "gpu_idle"
NEEDS: tuple[str, ...] = ()
RANK_KEY = "idle_pct"  # folded per rank on many-rank jobs by this (rank_groups)

DEFAULTS: dict[str, Any] = {
    "max_idle_pct": 20.0,
    # Below this much profiled GPU time the share is too noisy to act on (a few kernels).
    "min_total_us": 1000.0,
    # Idle share at or above which the finding is an error rather than a warning.
    "error_idle_pct": 60.0,
}

DOC = {
    "meaning": "The GPU is idle (no kernel, memcpy, memset or sync on any stream) for a large "
               "share of the profiled time: the host cannot feed it.",
    "rule": "Per rank, idle / (last GPU activity end − first start), Holistic Trace Analysis "
            "definitions, above max_idle_pct (error from error_idle_pct); traces with less "
            "than min_total_us of GPU time are ignored.",
    "fixes": "Remove host syncs (see host_sync), use DataLoader workers and pin_memory, "
             "larger batches, CUDA graphs or torch.compile to cut launch overhead, overlap "
             "communication with compute.",
}


def _pct(part: float, total: float) -> float:
    return round(100.0 * part / total, 2) if total > 0 else 0.0


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    cache = ctx.cache
    rows = shared(cache, ctx.con, gpu_time_breakdown)
    limit = float(th.max_idle_pct)
    error_at = float(th.error_idle_pct)
    min_total = float(th.min_total_us)
    flagged = [
        r for r in rows
        if r["total_us"] >= min_total and _pct(r["idle_us"], r["total_us"]) > limit
    ]
    if not flagged:
        return []
    by_step: dict[int, list[dict[str, Any]]] = {}
    for s in shared(cache, ctx.con, gpu_time_by_step):
        by_step.setdefault(s["rank"], []).append(s)
    causes = idle_causes(ctx.con, flagged, shared(cache, ctx.con, sync_sites))

    findings = []
    for r in flagged:
        idle_pct = _pct(r["idle_us"], r["total_us"])
        steps = by_step.get(r["rank"], [])
        step_idle = [
            {"step": int(s["step"]), "idle_pct": _pct(s["idle_us"], s["total_us"]),
             "total_us": s["total_us"]}
            for s in steps if s["total_us"] > 0
        ]
        over = [s for s in step_idle if s["idle_pct"] > limit]
        first_step = over[0]["step"] if over else (step_idle[0]["step"] if step_idle else None)
        evidence: dict[str, Any] = {
            **r,
            "idle_pct": idle_pct,
            "compute_pct": _pct(r["compute_us"], r["total_us"]),
            "non_compute_pct": _pct(r["non_compute_us"], r["total_us"]),
            "threshold_pct": limit,
        }
        why = causes.get(r["rank"], {"cause": "unknown"})
        evidence.update(why)
        if step_idle:
            evidence["steps"] = step_idle[:50]
        where = (f" ({len(over)} of {len(step_idle)} profiled steps above {limit:g}%)"
                 if step_idle else "")
        comm = r["non_compute_us"] > r["compute_us"]
        reason, advice = _explained(why)
        findings.append(
            Finding(
                id=ID,
                severity="error" if idle_pct >= error_at else "warning",
                title=f"GPU idle {idle_pct:.0f}% of profiled time on rank {r['rank']}",
                message=(
                    f"Rank {r['rank']}: the GPU ran nothing for {r['idle_us'] / 1e3:.1f} ms of "
                    f"{r['total_us'] / 1e3:.1f} ms profiled ({idle_pct:.1f}%){where}; compute "
                    f"kernels {evidence['compute_pct']:.1f}%, communication/memory "
                    f"{evidence['non_compute_pct']:.1f}%. {reason}"
                ),
                first_step=first_step,
                subject=f"rank {r['rank']}",
                evidence=evidence,
                advice=advice + ("; communication dominates the busy time too: overlap it "
                                 "with compute (DDP bucketing, FSDP prefetch)." if comm
                                 else "."),
                chart=anchors.GPU_TIME,
            )
        )
    return findings


def _explained(why: dict[str, Any]) -> tuple[str, str]:
    """(what the trace says the idle time comes from, what to do about it)."""
    cause = why.get("cause")
    if cause == "host_sync":
        return (f"{why['sync_idle_us'] / 1e3:.1f} ms of it began while the host waited in a "
                "sync: the queue drained while the host was blocked (see host_sync).",
                "Keep values on the GPU and read them every N steps instead of syncing in "
                "the step (see host_sync)")
    if cause == "input_bound":
        return (f"Data loading took {why['data_wait_us'] / 1e3:.1f} ms of the profiled "
                "steps: the GPU waits for its input.",
                "Feed the GPU faster: DataLoader num_workers, pin_memory=True, "
                "persistent_workers=True, prefetching, non_blocking copies")
    if cause == "launch_bound":
        return (f"Launch-bound: {why['kernels_per_step']:g} kernels a step, the median one "
                f"{why['median_kernel_us']:g} µs against {why['median_launch_us']:g} µs for "
                "each launch call, so the GPU finishes every kernel before the host has "
                "enqueued the next" + (f"; host ops take {why['cpu_op_us_per_step'] / 1e3:.1f} "
                                        "ms a step" if why.get("cpu_op_us_per_step") else "")
                + ".",
                "Give each launch more work and launch less often: a larger batch, "
                "torch.compile (mode='reduce-overhead' replays CUDA graphs), fused "
                "optimizers (AdamW(fused=True)) and fused kernels")
    return ("The trace shows neither a host sync, a data wait nor launch overhead behind "
            "it: the host is busy elsewhere between launches.",
            "Look at what the host does between steps in the trace's timeline (Python work, "
            "logging, checkpoints); larger batches, CUDA graphs or torch.compile cut launch "
            "overhead; see host_sync for waits")
