"""What went wrong: the detectors (one file each in ``detectors/``), their thresholds, the
findings they return, how causes explain symptoms, and the summary built from them."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "analyze": ".summary",
    "Analysis": ".analysis",
    "build_summary": ".summary",
    "render_text": ".summary",
    "fails": ".summary",
    "Finding": ".findings",
    "FINDING_IDS": ".findings",
}
"""Public name -> the module that defines it, imported on first use: importing a package
never pulls in more than it needs (the CLI's start-up stays fast)."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
