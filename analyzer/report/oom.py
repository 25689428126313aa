"""The report's "CUDA out of memory" section: the allocator's snapshot at the error, as the
``cuda_oom`` finding read it (its evidence: the snapshot is decoded once, by the detector).

What a GPU user looks for after an OOM: which lines of their code hold the memory (live
allocations by innermost user frame), what was allocated again and again and never freed
(the trace's live allocations by line and size: a leak), and the segments the cache holds
(how much of the reserved memory is free, and the largest free block: fragmentation).
"""

from __future__ import annotations

from typing import Any

from ..diagnosis.findings import Finding
from ..units import fmt_bytes


def _b(n: Any) -> str:
    return fmt_bytes(n) if isinstance(n, (int, float)) else "–"


def oom_section(findings: list[Finding]) -> list[dict[str, Any]]:
    """One entry per CUDA OOM whose run kept an allocator snapshot."""
    out = []
    for f in findings:
        ev = f.evidence or {}
        snap = ev.get("snapshot")
        if f.id != "cuda_oom" or not ev.get("oom") or not isinstance(snap, dict):
            continue
        seg = snap.get("segments") or {}
        entry: dict[str, Any] = {
            "rank": ev.get("rank"), "step": ev.get("step"), "cause": ev.get("cause"),
            "file": snap.get("file"), "error": snap.get("error"),
            "segment_count": seg.get("count", 0), "reserved": _b(seg.get("reserved_bytes")),
            "allocated": _b(seg.get("allocated_bytes")),
            "inactive": _b(seg.get("inactive_bytes")),
            "largest_free": _b(seg.get("largest_inactive_block_bytes")),
            "expandable": bool(seg.get("expandable")),
            "frames": [{"frame": g.get("frame"), "bytes": _b(g.get("bytes")),
                        "count": int(g.get("count") or 0), "largest": _b(g.get("largest_bytes"))}
                       for g in snap.get("live_by_frame") or []],
            "repeated": [{"frame": g.get("frame"), "size": _b(g.get("size")),
                          "count": int(g.get("count") or 0), "bytes": _b(g.get("bytes"))}
                         for g in snap.get("repeated_allocations") or []],
            "segments": [{"address": s.get("address"), "total": _b(s.get("total_size")),
                          "allocated": _b(s.get("allocated_size")),
                          "type": s.get("segment_type") or "–",
                          "blocks": int(s.get("blocks") or 0)}
                         for s in seg.get("largest") or []],
        }
        out.append(entry)
    return out
