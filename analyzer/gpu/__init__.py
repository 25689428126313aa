"""What the profiler traces say about the GPU: HTA-equivalent time breakdowns (idle, compute,
non-compute), overlap, launch delays, idle causes, memory, stragglers, and the overview and
advice the report shows."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "gpu_time_breakdown": ".gputime",
    "gpu_time_by_step": ".gputime",
    "kernel_breakdown": ".gputime",
    "has_trace_events": ".gputime",
    "gpu_time_rows": ".summary",
}
"""Public name -> the module that defines it, imported on first use: importing a package
never pulls in more than it needs (the CLI's start-up stays fast)."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
