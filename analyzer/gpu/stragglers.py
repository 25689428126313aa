"""Ranks that reach their collectives late, from the profiler traces of several ranks
(Holistic Trace Analysis's potential-straggler idea, made to say nothing on a healthy job).

A collective ends at about the same moment on every rank: each waits inside the NCCL kernel
until the last one arrives. So the rank that arrives late spends the least time in it, and
``median duration over ranks − its duration`` is how late it arrived. Durations, not start
times, because ranks on different hosts have different clocks.

Collectives are matched across ranks by (profiled step, kernel name, occurrence within the
step); those whose median duration is under ``min_kernel_share`` of the step are left out
(HTA: 1%). Per rank and step, the lateness of its matched collectives is summed and divided
by the step's length (median over ranks of its ProfilerStep span).
"""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np

from .gputime import COMM_RE, STEP_SPAN, has_trace_events
from .vocabulary import KERNEL_SQL

_SQL = f"""
WITH comm AS (
    SELECT rank, step, name, dur_us,
        row_number() OVER (PARTITION BY rank, step, name ORDER BY ts_us) AS seq
    FROM trace_events
    WHERE cat = {KERNEL_SQL} AND step IS NOT NULL AND dur_us IS NOT NULL
      AND regexp_matches(name, '{COMM_RE}')
),
spans AS (  -- the step's length on each rank: its ProfilerStep span
    SELECT rank, step, max(dur_us) AS us FROM trace_events
    WHERE step IS NOT NULL AND {STEP_SPAN}
    GROUP BY ALL
),
step_len AS (SELECT step, median(us) AS us FROM spans GROUP BY ALL),
matched AS (
    SELECT *, median(dur_us) OVER (PARTITION BY step, name, seq) AS med,
        count(*) OVER (PARTITION BY step, name, seq) AS n_ranks
    FROM comm
)
SELECT m.rank, m.step, sum(m.med - m.dur_us) AS late_us, any_value(l.us) AS step_us,
    count(*) AS collectives
FROM matched m JOIN step_len l ON l.step = m.step
WHERE m.n_ranks >= 2 AND m.med >= ? * l.us
GROUP BY ALL ORDER BY m.rank, m.step
"""


def collective_lateness(con: duckdb.DuckDBPyConnection, *,
                        min_kernel_share: float = 0.01) -> list[dict[str, Any]]:
    """Per rank and profiled step: ``{"rank", "step", "late_us", "step_us", "late_share",
    "collectives"}`` (``late_us`` < 0: it arrived early). Empty with fewer than two ranks
    tracing collectives."""
    if not has_trace_events(con):
        return []
    out = []
    for rank, step, late, step_us, n in con.execute(_SQL, [min_kernel_share]).fetchall():
        step_us = float(step_us)
        out.append({"rank": int(rank), "step": int(step), "late_us": round(float(late), 3),
                    "step_us": round(step_us, 3),
                    "late_share": float(late) / step_us if step_us > 0 else 0.0,
                    "collectives": int(n)})
    return out


def trace_stragglers(rows: list[dict[str, Any]], *, min_late_share: float = 0.05,
                     min_consistency: float = 0.7, min_z: float = 3.0) -> list[dict[str, Any]]:
    """Ranks late at their collectives by at least ``min_late_share`` of the step in at
    least ``min_consistency`` of their profiled steps, and (with four ranks or more) an
    outlier among the ranks: median lateness ``min_z`` robust σ above the ranks' median.
    Each: ``{"rank", "median_late_share", "median_late_us", "late_steps", "steps",
    "first_step"}``, latest first."""
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_rank.setdefault(r["rank"], []).append(r)
    if len(by_rank) < 2:
        return []
    med = {r: float(np.median([x["late_share"] for x in v])) for r, v in by_rank.items()}
    values = np.array(list(med.values()))
    centre = float(np.median(values))
    sigma = 1.4826 * float(np.median(np.abs(values - centre)))
    out = []
    for rank, steps in by_rank.items():
        late = [x for x in steps if x["late_share"] >= min_late_share]
        if len(late) < min_consistency * len(steps) or med[rank] < min_late_share:
            continue
        if len(by_rank) >= 4 and sigma > 0 and (med[rank] - centre) < min_z * sigma:
            continue
        out.append({"rank": rank, "median_late_share": round(med[rank], 4),
                    "median_late_us": round(float(np.median([x["late_us"] for x in steps])), 1),
                    "late_steps": len(late), "steps": len(steps),
                    "first_step": min(x["step"] for x in late)})
    out.sort(key=lambda x: -x["median_late_share"])
    return out
