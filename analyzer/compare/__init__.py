"""``tracealyze compare``: did a change make training worse? ``compare_runs`` gives the
verdict and its evidence, ``write_compare_report`` the page."""

from __future__ import annotations

from .. import lazy_exports

_EXPORTS = {
    "compare_runs": ".runs",
    "write_compare_report": ".page",
}
"""Public name -> the module that defines it (imported on first use)."""

__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
