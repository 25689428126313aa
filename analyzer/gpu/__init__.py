"""What the profiler traces say about the GPU: HTA-equivalent time breakdowns (idle, compute,
non-compute), overlap, launch delays, idle causes, memory, stragglers, and the overview and
advice the report shows."""

from __future__ import annotations

from .. import lazy_exports

_EXPORTS = {
    "gpu_time_breakdown": ".gputime",
    "gpu_time_by_step": ".gputime",
    "kernel_breakdown": ".gputime",
    "has_trace_events": ".gputime",
    "gpu_time_rows": ".summary",
}
"""Public name -> the module that defines it (imported on first use)."""

__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
