"""What every chart builder of the report needs: the connection, the rank the single-rank
charts show, and the findings (to mark where they start)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb

from ..diagnosis.findings import Finding


@dataclass
class ReportContext:
    con: duckdb.DuckDBPyConnection
    ranks: list[int]
    rank: int
    """The rank the per-run charts show (the lowest; per-rank charts compare the others)."""
    findings: list[Finding] = field(default_factory=list)
    """The analysis' findings, JSON-safe (cards.for_display), ranked."""
    gpu_time: list[dict[str, Any]] = field(default_factory=list)
    """The summary's GPU time breakdown per rank (computed once per report)."""
    buckets: int = 1000
    """Buckets per line chart; heatmaps and per-rank charts use fewer."""
    knobs: dict[str, Any] = field(default_factory=dict)
    """The recorder's knobs (run.json): which steps did planned extra work."""

    def scalar(self, sql: str, params: list[Any] | None = None) -> Any:
        row = self.con.execute(sql, params or []).fetchone()
        return None if row is None else row[0]

    def finding(self, fid: str) -> Finding | None:
        """The first finding with id ``fid`` (findings are ranked, most severe first)."""
        return next((f for f in self.findings if f.id == fid), None)
