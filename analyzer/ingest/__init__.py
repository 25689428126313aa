"""Profiler traces (Chrome/Kineto JSON, any size, streamed) into the ``trace_events``
table: ``read_trace`` for one file, ``import_traces`` into a run directory
(``tracealyze import-trace``)."""

from __future__ import annotations

from .. import lazy_exports

_EXPORTS = {
    "read_trace": ".read",
    "trace_id_for": ".read",
    "import_traces": ".importer",
    "Limits": ".stream",
}
"""Public name -> the module that defines it (imported on first use)."""

__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
