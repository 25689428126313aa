"""Profiler traces (Chrome/Kineto JSON, any size, streamed) into the ``trace_events``
table: ``read_trace`` for one file, ``import_traces`` into a run directory
(``tracealyze import-trace``)."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "read_trace": ".read",
    "trace_id_for": ".read",
    "import_traces": ".importer",
    "Limits": ".stream",
}
"""Public name -> the module that defines it, imported on first use: importing a package
never pulls in more than it needs (the CLI's start-up stays fast)."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
