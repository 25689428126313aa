"""Statistics shared below their users: robust estimators (median/MAD, Theil–Sen,
Mann–Kendall) and the step-time outlier rule of the detector, the report's chart and compare."""

from __future__ import annotations

from .. import lazy_exports

_EXPORTS = {
    "mad_sigma": ".robust",
    "theil_sen": ".robust",
    "mann_kendall": ".robust",
    "bucket_series": ".robust",
    "rolling_median": ".robust",
    "outliers": ".steptime",
    "recorder_busy": ".steptime",
}
"""Public name -> the module that defines it (imported on first use)."""

__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
