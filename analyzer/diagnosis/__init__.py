"""What went wrong: the detectors (one file each in ``detectors/``), their thresholds, the
findings they return, how causes explain symptoms, and the summary built from them."""

from __future__ import annotations

from .. import lazy_exports

_EXPORTS = {
    "analyze": ".summary",
    "Analysis": ".analysis",
    "build_summary": ".summary",
    "render_text": ".summary",
    "fails": ".summary",
    "Finding": ".findings",
    "FINDING_IDS": ".findings",
}
"""Public name -> the module that defines it (imported on first use)."""

__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
