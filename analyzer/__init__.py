"""tracealyze.analyzer: reads run directories with DuckDB and says what went wrong.

Never imports torch (start-up must stay fast and the analyzer runs where torch is absent).
The library the CLI is a thin layer over::

    from tracealyze.analyzer import open_run, build_summary, write_report
    summary = build_summary("runs/exp1")          # the findings, as `summary --json` gives them
    write_report("runs/exp1")                     # ./exp1.html

The map of the sub-packages is in CONTRIBUTING.md.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

_EXPORTS = {
    "open_run": ".run.catalog",
    "Analysis": ".diagnosis.analysis",
    "analyze": ".diagnosis.summary",
    "build_summary": ".diagnosis.summary",
    "write_report": ".report.page",
    "compare_runs": ".compare.runs",
    "import_traces": ".ingest.importer",
    "open_runs": ".run.multirun",
}
"""Public name -> the module that defines it (imported on first use)."""


def lazy_exports(package: str, exports: dict[str, str]
                 ) -> tuple[Callable[[str], Any], list[str]]:
    """A package's ``(__getattr__, __all__)`` for ``exports`` (public name -> the module,
    relative to ``package``, that defines it), each imported on first use: importing a
    package never pulls in more than it needs (the CLI's start-up stays fast)."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(import_module(exports[name], package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__, sorted(exports)


__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
