"""Run directories opened read-only: one DuckDB view per table over all ranks and parts
(``open_run``), several runs side by side (``open_runs``), raw traces and sharded models
included."""

from __future__ import annotations

from .. import lazy_exports

_EXPORTS = {
    "open_run": ".catalog",
    "scan_run": ".catalog",
    "Run": ".handle",
    "open_runs": ".multirun",
    "RunSet": ".multirun",
}
"""Public name -> the module that defines it (imported on first use)."""

__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
