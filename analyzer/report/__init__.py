"""``tracealyze report``: one self-contained HTML page per run (``write_report``); the charts
by subject in ``charts/``."""

from __future__ import annotations

from .. import lazy_exports

_EXPORTS = {
    "write_report": ".page",
}
"""Public name -> the module that defines it (imported on first use)."""

__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
