"""Findings: what the detectors report, and how they are ranked."""

from __future__ import annotations

import dataclasses
import pkgutil
from pathlib import Path
from typing import Any

from tracealyze.format.vocabulary import SEVERITIES, Severity

from .display import MAX_NAME, MAX_TEXT, clip, clip_tree

__all__ = ["FINDING_IDS", "SEVERITIES", "Finding", "Severity", "rank_findings",
           "severity_rank"]

def _detector_ids(folder: Path | None = None) -> tuple[str, ...]:
    """The detector registry, built from the folder: every public module of ``detectors/``
    is the detector of the finding id it is named after (``detectors.base.discover`` checks
    that its ``ID`` says the same). Adding a detector is adding its file."""
    folder = folder or Path(__file__).with_name("detectors")
    return tuple(sorted(m.name for m in pkgutil.iter_modules([str(folder)])
                        if not m.name.startswith("_") and m.name != "base"))


FINDING_IDS: tuple[str, ...] = _detector_ids()
"""Every finding id, one per detector module, in name order (the order detectors run)."""

FORMER_IDS: dict[str, str] = {"cuda_fragmentation": "cuda_oom"}
"""Renamed finding ids, old → new, accepted by ``--fail-on`` and ``--set`` for one release
(the JSON finding carries its ``former_id`` meanwhile)."""


_FORMER_OF = {new: old for old, new in FORMER_IDS.items()}


def canonical_id(name: str) -> str | None:
    """The finding id ``name`` means (a current id, or a former one), else None."""
    if name in FINDING_IDS:
        return name
    return FORMER_IDS.get(name)


def severity_rank(severity: str) -> int:
    """Position of ``severity`` in :data:`SEVERITIES`; ValueError for an unknown one."""
    try:
        return SEVERITIES.index(severity)
    except ValueError:
        raise ValueError(
            f"unknown severity {severity!r}; expected one of {', '.join(SEVERITIES)}"
        ) from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Finding:
    """One thing a detector found. Serialises to the DESIGN.md summary JSON."""

    id: str
    """One of :data:`FINDING_IDS`."""
    severity: Severity
    """info, warning, error or critical."""
    title: str
    """Short headline, e.g. 'Memory grows 1.0 MiB per step'."""
    message: str
    """What was seen, in a sentence or two, with the numbers that matter."""
    first_step: int | None = None
    """First step where the problem shows; None when it has no step (e.g. a whole-run ratio)."""
    subject: str | None = None
    """What it is about: a parameter, module path, memory counter, op or rank."""
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Numbers a user needs to act on it (JSON-serialisable)."""
    advice: str = ""
    """What to try."""
    chart: str | None = None
    """Anchor of the report chart that shows it (e.g. 'memory', 'grad-heatmap')."""
    caused_by: str | None = None
    """Id of the root-cause finding that explains this one (``causality.link``)."""
    explains: tuple[str, ...] = ()
    """Ids of the findings this root cause explains (listed right after it)."""

    def __post_init__(self) -> None:
        if self.id not in FINDING_IDS:
            raise ValueError(f"unknown finding id {self.id!r}")
        severity_rank(self.severity)
        # Names in findings come from the run (kernels, ops, events): shown, so bounded.
        for name, limit in (("title", MAX_NAME), ("message", MAX_TEXT), ("advice", MAX_TEXT)):
            object.__setattr__(self, name, clip(getattr(self, name), limit))
        if self.subject is not None:
            object.__setattr__(self, "subject", clip(self.subject, MAX_NAME))
        object.__setattr__(self, "evidence", clip_tree(self.evidence))

    def to_json(self) -> dict[str, Any]:
        """The summary-JSON object of this finding."""
        return {
            "id": self.id,
            "severity": self.severity,
            "title": self.title,
            "message": self.message,
            "first_step": self.first_step,
            "subject": self.subject,
            "evidence": self.evidence,
            "advice": self.advice,
            "chart": self.chart,
            "caused_by": self.caused_by,
            "explains": list(self.explains),
            **({"former_id": old} if (old := _FORMER_OF.get(self.id)) else {}),
        }


def rank_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first; within a severity, earliest first_step first (None last)."""
    return sorted(
        findings,
        key=lambda f: (
            -severity_rank(f.severity),
            f.first_step is None,
            f.first_step if f.first_step is not None else 0,
            f.id,
        ),
    )
