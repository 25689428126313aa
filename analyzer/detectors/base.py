"""The detector protocol, the analysis context and detector discovery.

A detector is a module in ``tracealyze.analyzer.detectors`` (its name not starting with ``_``
and not ``base``) that defines:

* ``ID: str`` — the finding id it reports (one of ``findings.FINDING_IDS``);
* ``DEFAULTS: dict[str, float | int | bool | str]`` — its documented thresholds; the user
  overrides them with ``--set <ID>.<key>=<value>`` or a config file;
* ``def detect(ctx: Context, th: Mapping[str, Any]) -> list[Finding]``.

Optional: ``ALIASES: tuple[str, ...]`` (other names accepted in ``--set``), ``DOC: dict``
with ``meaning``, ``rule`` and ``fixes`` (rendered into docs/ANALYZER.md).

Modules are found with pkgutil, so adding a detector is adding a file: no registry to edit.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from ..findings import Finding

if TYPE_CHECKING:
    from ..catalog import Run


class Detector(Protocol):
    """What a detector module looks like (for type checkers)."""

    ID: str
    DEFAULTS: dict[str, Any]

    def detect(self, ctx: Context, th: Mapping[str, Any]) -> list[Finding]: ...


@dataclass
class Context:
    """Everything a detector may look at. Shared, expensive results are cached here."""

    run: Run
    thresholds: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """detector id -> effective thresholds (defaults with the user's overrides)."""
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def con(self) -> Any:
        """The run's duckdb connection (views: steps, tensor_stats, ...)."""
        return self.run.con

    def th(self, detector_id: str) -> Mapping[str, Any]:
        """Effective thresholds of ``detector_id`` (empty mapping if unknown)."""
        return self.thresholds.get(detector_id, {})

    def cached(self, key: str, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per analysis; detectors share heavy queries through this."""
        if key not in self.cache:
            self.cache[key] = compute()
        return self.cache[key]

    def rows(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        return self.con.execute(sql, params or []).fetchall()

    def arrays(self, sql: str, params: list[Any] | None = None) -> dict[str, Any]:
        """Result columns as numpy arrays (``fetchnumpy``); small per-step series only."""
        return self.con.execute(sql, params or []).fetchnumpy()


@dataclass(frozen=True)
class LoadError:
    """A detector module that could not be imported or does not follow the protocol."""

    module: str
    error: str


def discover() -> tuple[list[ModuleType], list[LoadError]]:
    """All detector modules of this package, sorted by module name, and the broken ones."""
    from .. import detectors as pkg

    mods: list[ModuleType] = []
    errors: list[LoadError] = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.name == "base" or info.ispkg:
            continue
        qual = f"{pkg.__name__}.{info.name}"
        try:
            mod = importlib.import_module(qual)
        except Exception as e:  # a broken detector must not stop the others
            errors.append(LoadError(info.name, f"{type(e).__name__}: {e}"))
            continue
        if not (isinstance(getattr(mod, "ID", None), str)
                and isinstance(getattr(mod, "DEFAULTS", None), dict)
                and callable(getattr(mod, "detect", None))):
            # helper modules without the protocol are simply not detectors
            continue
        mods.append(mod)
    return mods, errors
