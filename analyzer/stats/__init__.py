"""Statistics shared below their users: robust estimators (median/MAD, Theil–Sen,
Mann–Kendall) and the step-time outlier rule of the detector, the report's chart and compare."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "mad_sigma": ".robust",
    "theil_sen": ".robust",
    "mann_kendall": ".robust",
    "bucket_series": ".robust",
    "rolling_median": ".robust",
    "outliers": ".steptime",
    "recorder_busy": ".steptime",
}
"""Public name -> the module that defines it, imported on first use: importing a package
never pulls in more than it needs (the CLI's start-up stays fast)."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
