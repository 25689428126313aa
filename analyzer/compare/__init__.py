"""``tracealyze compare``: did a change make training worse? ``compare_runs`` gives the
verdict and its evidence, ``write_compare_report`` the page."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "compare_runs": ".runs",
    "write_compare_report": ".page",
}
"""Public name -> the module that defines it, imported on first use: importing a package
never pulls in more than it needs (the CLI's start-up stays fast)."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
