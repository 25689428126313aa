"""Run directories opened read-only: one DuckDB view per table over all ranks and parts
(``open_run``), several runs side by side (``open_runs``), raw traces and sharded models
included."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "open_run": ".catalog",
    "scan_run": ".catalog",
    "Run": ".catalog",
    "open_runs": ".multirun",
    "RunSet": ".multirun",
}
"""Public name -> the module that defines it, imported on first use: importing a package
never pulls in more than it needs (the CLI's start-up stays fast)."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
