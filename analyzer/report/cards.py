"""The findings as the report shows them: typed :class:`~..diagnosis.findings.Finding`
objects from the one :class:`~..diagnosis.analysis.Analysis` of the run (the summary reads
the same objects), each made a card with its evidence laid out for reading and a link to the
chart that shows it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..diagnosis.findings import Finding
from ..diagnosis.summary import clean_json
from .text import format_evidence


def for_display(findings: Iterable[Finding]) -> list[Finding]:
    """The findings with JSON-safe evidence and step (numpy scalars to Python, NaN/Inf to
    text): what the charts put in the page's JSON and the cards print, as in the summary."""
    out = []
    for f in findings:
        step = f.first_step
        out.append(dataclasses.replace(
            f, evidence=clean_json(f.evidence),
            first_step=int(step) if step is not None else None))
    return out


@dataclass(frozen=True)
class FindingCard:
    """One finding's card: the finding itself (its fields read through, ``card.title``),
    its evidence as value chips and tables (``text.format_evidence``), and the anchor of the
    chart it links to when the report drew that chart."""

    finding: Finding
    chips: dict[str, list[Any]]
    link: str | None

    def __getattr__(self, name: str) -> Any:
        if name == "finding":  # (not set yet: copying, unpickling)
            raise AttributeError(name)
        return getattr(self.finding, name)


def cards(findings: Iterable[Finding], anchors: set[str]) -> list[FindingCard]:
    """A card per finding, in the analysis' order (root causes first)."""
    return [FindingCard(f, format_evidence(_shown(f)), f.chart if f.chart in anchors else None)
            for f in findings]


def _shown(f: Finding) -> dict[str, Any]:
    """The evidence a card lists: an allocator snapshot's summary has its own section
    ("CUDA out of memory"), so the card names the file only."""
    snap = f.evidence.get("snapshot")
    if f.id == "cuda_oom" and isinstance(snap, dict):
        return {**f.evidence, "snapshot": f"{snap.get('file')} (see Out of memory below)"}
    return f.evidence
