"""``tracealyze report``: one self-contained HTML page per run (``write_report``); the charts
by subject in ``charts/``."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "write_report": ".page",
}
"""Public name -> the module that defines it, imported on first use: importing a package
never pulls in more than it needs (the CLI's start-up stays fast)."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
