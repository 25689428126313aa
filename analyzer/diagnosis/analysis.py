"""One run analysed once: ``Analysis(run)`` runs every detector a single time and holds what
the summary, the report and ``compare`` read from it.

As Holistic Trace Analysis' ``TraceAnalysis`` parses a trace once and answers many questions,
an ``Analysis`` holds one memo (the detectors' shared queries and trace analyses, reused by
the GPU-time rows), the ``Finding`` objects, what could not be checked and the GPU time
breakdown, each computed on first use. A detector that raises does not end the analysis: its
failure becomes an ``error`` finding under its id, so the user sees the analysis is incomplete
and a CI gate on ``--fail-on error`` never passes a run it could not fully check.
"""

from __future__ import annotations

import traceback
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Any

from ..gpu.vocabulary import GPU_ACTIVITY_SQL
from ..run.catalog import Run
from .causality import link
from .coverage import not_checked
from .findings import Finding
from .rank_groups import fold_per_rank


class Analysis:
    """The findings of one opened ``run`` with the given thresholds.

    ``overrides``: ``{detector: {key: value}}`` or ``["detector.key=value", ...]`` (as
    ``--set`` gives them); ``config_file``: a TOML/JSON thresholds file. A bad threshold
    raises ``ConfigError`` at construction, before any detector runs. ``memo``: results
    the detectors share, keyed by the analysis that computes them (pass one dict to reuse
    them across calls)."""

    def __init__(self, run: Run, overrides: Any = None, *,
                 config_file: Path | str | None = None,
                 memo: dict[str, Any] | None = None) -> None:
        from . import thresholds as config
        from .detectors.base import discover

        self.run = run
        self.memo: dict[str, Any] = {} if memo is None else memo
        self.detectors: list[ModuleType]
        self.detectors, self._load_errors = discover()
        self.thresholds = config.resolve(self.detectors, overrides, config_file)
        self._late: list[Finding] = []  # failures found after the detectors ran

    @cached_property
    def findings(self) -> list[Finding]:
        """All findings, root causes first, each followed by the findings it explains
        (``causality.link``); groups by their most severe member."""
        from .detectors.base import Context

        ctx = Context(run=self.run, thresholds=self.thresholds, cache=self.memo)
        found: list[Finding] = [
            failure(err.module, "could not be loaded", RuntimeError(f"{err.module}: {err.error}"))
            for err in self._load_errors]
        for mod in self.detectors:
            th = self.thresholds[mod.ID]
            if not th.get("enabled", True):
                continue
            try:
                got = mod.detect(ctx, th) or []
            except Exception as e:  # one detector's bug must not hide the others' findings
                found.append(failure(mod.ID, "raised an exception", e))
                continue
            found.extend(fold_per_rank(list(got), getattr(mod, "RANK_KEY", None)))
        return link(found)

    @cached_property
    def not_checked(self) -> list[dict[str, Any]]:
        """What the run's data cannot support, each with the detectors that need it."""
        return not_checked(self.run, self.detectors)

    @cached_property
    def gpu_time(self) -> list[dict[str, Any]] | None:
        """DESIGN.md's GPU time breakdown per rank (None without device work in the
        traces). A failure to compute it is a ``gpu_idle`` error finding in ``late``."""
        try:
            (n,) = self.run.con.execute(
                f"SELECT count(*) FROM trace_events WHERE cat IN {GPU_ACTIVITY_SQL}"
            ).fetchone()
            if not n:
                return None
            from ..gpu.summary import gpu_time_rows

            _ = self.findings  # the detectors' trace analyses fill the memo first
            return gpu_time_rows(self.run.con, cache=self.memo)
        except Exception as e:  # breakdown failure: say so, keep the rest
            self._late.append(failure("gpu_idle", "could not compute the GPU time "
                                                  "breakdown", e))
            return None

    @property
    def late(self) -> list[Finding]:
        """Failures found after the detectors ran (the GPU time breakdown's)."""
        return list(self._late)


def failure(det_id: str, what: str, exc: BaseException) -> Finding:
    """The ``error`` finding that says a check could not be done, and where it failed."""
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" at {Path(frame.filename).name}:{frame.lineno}" if frame else ""
    return Finding(
        id=det_id, severity="error",
        title=f"Detector {det_id} failed; this check was not done",
        message=f"The {det_id} detector {what}: {type(exc).__name__}: {exc}{where}.",
        advice="This is a bug in tracealyze or an unexpected run layout; please report it "
               "with the run's run.json. Other findings are unaffected.",
        evidence={"detector_error": f"{type(exc).__name__}: {exc}"},
    )
