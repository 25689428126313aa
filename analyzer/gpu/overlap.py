"""Communication/computation overlap (Holistic Trace Analysis 0.5's
``get_comm_comp_overlap``, per rank and per profiled step).

``comm_comp_overlap_pct`` = time during which a communication kernel and a computation kernel
both run / time during which a communication kernel runs × 100. Each kind's busy time is the
union of its kernels' intervals over all streams (kernel types as in ``gputime``); the
overlap is the length of the intersection of the two unions, by a sweep over their block
edges (no pairwise join). The kernels are HTA's GPU side (:mod:`.htarows`: every event with a
stream, sync events included, typed by name); a rank's figure is over all its
traces, a step's over the activity its host side launched. None when there is no
communication.
"""

from __future__ import annotations

from typing import Any

import duckdb

from .gputime import UNION_SQL, activity_sql, has_trace_events

_TAIL = """
, edges AS (  -- +1/-1 at a communication block's ends, +2/-2 at a computation block's
    SELECT rank, trace_id, part, s AS t, CASE k WHEN 'comm' THEN 1 ELSE 2 END AS d FROM blocks
    UNION ALL
    SELECT rank, trace_id, part, e AS t, CASE k WHEN 'comm' THEN -1 ELSE -2 END AS d FROM blocks
),
sweep AS (
    SELECT *,
        sum(d) OVER w AS running,
        lead(t) OVER w AS next_t
    FROM edges
    WINDOW w AS (PARTITION BY rank, trace_id, part ORDER BY t, d ROWS UNBOUNDED PRECEDING)
),
overlap AS (
    SELECT rank, part, sum(next_t - t) AS us FROM sweep WHERE running = 3 GROUP BY ALL
),
comm AS (SELECT rank, part, sum(union_us) AS us FROM unions WHERE k = 'comm' GROUP BY ALL)
SELECT c.rank, c.part, coalesce(o.us, 0), c.us
FROM comm c LEFT JOIN overlap o ON o.rank = c.rank AND o.part = c.part
ORDER BY c.rank, c.part
"""


def comm_comp_overlap(con: duckdb.DuckDBPyConnection, *,
                      by_step: bool = False) -> list[dict[str, Any]]:
    """Per rank (and ``step`` with ``by_step``) that communicates:
    ``{"rank", "comm_us", "overlap_us", "comm_comp_overlap_pct"}``. Sorted; ranks (steps)
    without communication kernels are left out."""
    if not has_trace_events(con):
        return []
    part, where = ("step", "step IS NOT NULL") if by_step else ("0", "TRUE")
    keyed = (
        f"SELECT rank, trace_id, {part} AS part, "
        "CASE ktype WHEN 'communication' THEN 'comm' ELSE 'comp' END AS k, s, e FROM act "
        f"WHERE ktype IN ('communication', 'computation') AND {where}"
    )
    sql = activity_sql() + UNION_SQL.format(keyed=keyed) + _TAIL
    out = []
    for rank, p, overlap, comm in con.execute(sql).fetchall():
        row: dict[str, Any] = {"rank": int(rank)}
        if by_step:
            row["step"] = int(p)
        comm, overlap = float(comm), float(overlap)
        row.update(comm_us=round(comm, 3), overlap_us=round(overlap, 3),
                   comm_comp_overlap_pct=round(100.0 * overlap / comm, 2) if comm > 0 else None)
        out.append(row)
    return out
