"""The detector protocol, the analysis context and detector discovery.

A detector is a module in ``tracealyze.analyzer.diagnosis.detectors`` named after the finding
id it reports; the registry (``findings.FINDING_IDS``) is built from this folder, so adding a
detector is adding its file (``tests/analyzer/test_registry.py`` checks every file follows
the protocol). It defines:

* ``ID: str`` — the finding id it reports (its module name);
* ``NEEDS: tuple[str, ...]`` — the data it reads, from ``coverage.CHECKS`` ("loss",
  "gradients", ...): a run without it lists the detector under ``not_checked``;
* ``DEFAULTS: dict[str, float | int | bool | str]`` — its documented thresholds; the user
  overrides them with ``--set <ID>.<key>=<value>`` or a config file;
* ``def detect(ctx: Context, th: Thresholds) -> list[Finding]``.

Optional: ``ALIASES: tuple[str, ...]`` (other names accepted in ``--set``), ``DOC: dict``
with ``meaning``, ``rule`` and ``fixes`` (rendered into README's findings table).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from ..findings import FINDING_IDS, Finding
from ..thresholds import Thresholds

if TYPE_CHECKING:
    from ...run.catalog import Run


class Detector(Protocol):
    """What a detector module looks like (for type checkers)."""

    ID: str
    NEEDS: tuple[str, ...]
    DEFAULTS: dict[str, Any]

    def detect(self, ctx: Context, th: Thresholds) -> list[Finding]: ...


@dataclass
class Context:
    """Everything a detector may look at. Shared, expensive results are cached here."""

    run: Run
    thresholds: Mapping[str, Thresholds] = field(default_factory=dict)
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
    """The registered detector modules (``FINDING_IDS`` order) and the ones that are broken:
    not importable, or not following the protocol under their own id."""
    mods: list[ModuleType] = []
    errors: list[LoadError] = []
    for det_id in FINDING_IDS:
        try:
            mod = importlib.import_module(f"{__package__}.{det_id}")
        except Exception as e:  # a broken detector must not stop the others
            errors.append(LoadError(det_id, f"{type(e).__name__}: {e}"))
            continue
        if not (getattr(mod, "ID", None) == det_id
                and isinstance(getattr(mod, "NEEDS", None), tuple)
                and isinstance(getattr(mod, "DEFAULTS", None), dict)
                and callable(getattr(mod, "detect", None))):
            errors.append(LoadError(det_id, "does not define ID, NEEDS, DEFAULTS and detect()"))
            continue
        mods.append(mod)
    return mods, errors
