"""cuda_fragmentation: the caching allocator reserves far more than is allocated, or has to
retry allocations (cudaMalloc failed → cache flushed → slow), or hit OOMs."""

from __future__ import annotations

from typing import Any

from ...units import fmt_bytes
from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from .base import Context

ID = "cuda_fragmentation"
NEEDS: tuple[str, ...] = ("memory",)
DEFAULTS: dict[str, Any] = {
    "max_reserved_ratio": 2.0,      # median reserved / allocated above this ...
    "min_gap_bytes": 1073741824,    # ... with at least 1 GiB reserved but unused
    "max_retries": 0,               # more alloc retries than this → warning
}
DOC = {
    "meaning": "GPU memory is fragmented: reserved ≫ allocated, allocation retries or OOMs.",
    "rule": "median cuda_reserved/cuda_allocated > max_reserved_ratio with a gap ≥ "
            "min_gap_bytes, or cuda_alloc_retries grows by more than max_retries, or "
            "cuda_ooms > 0 (error).",
    "fixes": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, avoid varying tensor shapes "
             "(pad/bucket sequence lengths), free large temporaries early, smaller batch.",
}


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    rows = ctx.rows(
        """
        SELECT rank,
               median(cuda_reserved_bytes::DOUBLE / nullif(cuda_allocated_bytes, 0)) AS ratio,
               median(cuda_reserved_bytes - cuda_allocated_bytes) AS gap,
               max(cuda_alloc_retries) - min(cuda_alloc_retries) AS retries,
               max(cuda_ooms) AS ooms,
               min(step) FILTER (WHERE cuda_alloc_retries > 0) AS first_retry,
               min(step) FILTER (WHERE cuda_ooms > 0) AS first_oom,
               min(step) FILTER (WHERE cuda_reserved_bytes > 0) AS first_step,
               max(cuda_reserved_bytes) AS max_reserved
        FROM memory WHERE cuda_reserved_bytes IS NOT NULL OR cuda_alloc_retries IS NOT NULL
        GROUP BY rank ORDER BY rank
        """)
    out = []
    for r, ratio, gap, retries, ooms, first_retry, first_oom, first, max_res in rows:
        ev = {"rank": r, "median_reserved_over_allocated": ratio, "median_gap_bytes": gap,
              "alloc_retries": retries, "ooms": ooms, "max_reserved_bytes": max_res}
        if ooms:
            out.append(Finding(
                id=ID, severity="error", subject="cuda_ooms", first_step=first_oom,
                title=f"CUDA out-of-memory on rank {r}",
                message=f"The CUDA allocator reported {ooms} OOM(s) on rank {r}, first at "
                        f"step {first_oom}.",
                advice=DOC["fixes"], evidence=ev, chart=anchors.MEMORY))
        elif retries and retries > th.max_retries:
            out.append(Finding(
                id=ID, severity="warning", subject="cuda_alloc_retries",
                first_step=first_retry,
                title=f"{retries} CUDA allocation retries on rank {r}",
                message=(f"The caching allocator had to free its cache and retry "
                         f"{retries} allocation(s) on rank {r} (first at step {first_retry}); "
                         "each retry synchronises and slows the step."
                         + (f" Reserved/allocated ≈ {ratio:.1f}." if ratio else "")),
                advice=DOC["fixes"], evidence=ev, chart=anchors.MEMORY))
        elif ratio and gap and ratio > th.max_reserved_ratio and gap >= th.min_gap_bytes:
            out.append(Finding(
                id=ID, severity="warning", subject="cuda_reserved_bytes", first_step=first,
                title=f"CUDA memory fragmented on rank {r} (reserved {ratio:.1f}× allocated)",
                message=(f"Rank {r} keeps {fmt_bytes(gap)} reserved but unallocated "
                         f"(median reserved/allocated {ratio:.1f})."),
                advice=DOC["fixes"], evidence=ev, chart=anchors.MEMORY))
    return out
