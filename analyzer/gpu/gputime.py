"""GPU time breakdown over the ``trace_events`` view (DESIGN.md 'GPU time breakdown').

Equal to Holistic Trace Analysis 0.5's ``get_temporal_breakdown`` (and the kernel-type unions
of ``get_gpu_kernel_breakdown``) with ``include_last_profiler_step=True``, on HTA's own rows
(:mod:`.htarows`):

* activity: HTA's GPU side, every event with a stream — kernels, memcpy, memset, and also
  the device's sync events (a device-wide ``Context Sync`` stretches the window; ``Stream
  Wait Event`` counts as computation, its name matching none of HTA's other patterns);
* the launched-after-the-last-step cut and the dropping of activity whose launch is not in
  the trace, as HTA applies them (see :mod:`.htarows`);
* ``total`` = last end − first start; ``idle`` = total − union of busy intervals over all
  streams; ``compute`` = union of compute-kernel intervals; ``non_compute`` = the rest.

Each trace is measured on its own and a rank's figures are the sums over its traces, so the
gap between two profiling windows of one run never counts as idle time.

Everything is one DuckDB query per call: interval unions are computed with window functions
(running max of interval ends, a new group where a start passes it), not Python loops.
"""

from __future__ import annotations

from typing import Any

import duckdb

from .htarows import ROWS_SQL
from .vocabulary import GPU_SIDE_SQL

# Kernel classes (HTA 0.5 utils: NCCL_KERNEL_RE, MEMORY_KERNEL_RE, NCCL_COMPUTE_KERNEL_RE).
# Python's re.match anchors at the start; RE2's regexp_matches searches, hence the explicit
# '^' and the dropped leading '.*'.
COMM_RE = r"^nccl.*Kernel"
MEMORY_RE = r"^(Memcpy|Memset|dma)"
NON_COMPUTE_RE = r"^nccl.*Kernel|Memcpy|^Memset|Sync"

STEP_SPAN = f"name LIKE 'ProfilerStep#%' AND cat NOT IN {GPU_SIDE_SQL}"
"""A ProfilerStep span of the host (its GPU-side copies are not step spans)."""

_ACTIVITY_SQL = ROWS_SQL + f"""
, t0 AS (SELECT rank, trace_id, min(ts_us) AS t0 FROM te GROUP BY ALL),
act AS (
    -- Times relative to the trace start: ns traces carry epoch microseconds with fractions,
    -- and at 1.7e15 us a float64 resolves only 0.25 us, so adding dur to the absolute ts
    -- would round every interval end (HTA subtracts the trace start first, too).
    SELECT a.rank, a.trace_id, a.step, a.cat, a.name, a.hstream AS stream,
        a.ts_us - z.t0 AS s, (a.ts_us - z.t0) + a.dur_us AS e,
        a.launch_ts - z.t0 AS launched,
        CASE
            WHEN regexp_matches(a.name, '{COMM_RE}') THEN 'communication'
            WHEN regexp_matches(a.name, '{MEMORY_RE}') THEN 'memory'
            WHEN NOT regexp_matches(a.name, '{NON_COMPUTE_RE}') THEN 'computation'
            ELSE 'other'
        END AS ktype
    FROM hta a
    JOIN t0 z ON z.rank = a.rank AND z.trace_id = a.trace_id
    WHERE a.hstream <> -1  -- HTA's GPU side: every event with a stream
)
"""


def activity_sql() -> str:
    """The ``WITH ... act AS (...)`` prefix: the GPU side of HTA's rows (:mod:`.htarows`)
    per rank and trace, times relative to the trace start (``s``, ``e``; ``launched``: its
    launch call's start), kernel type in ``ktype``."""
    return _ACTIVITY_SQL


# Union length of intervals per (rank, trace_id, grp): sort by start; an interval opens a new
# merged block when it starts after every earlier interval has ended.
UNION_SQL = """
, keyed AS ({keyed}),
o AS (
    SELECT *, max(e) OVER (PARTITION BY rank, trace_id, part, k ORDER BY s, e
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
    FROM keyed
),
g AS (
    SELECT *, sum(CASE WHEN prev_end IS NULL OR s > prev_end THEN 1 ELSE 0 END)
              OVER (PARTITION BY rank, trace_id, part, k ORDER BY s, e
                    ROWS UNBOUNDED PRECEDING) AS blk
    FROM o
),
blocks AS (
    SELECT rank, trace_id, part, k, blk, min(s) AS s, max(e) AS e FROM g GROUP BY ALL
),
unions AS (
    SELECT rank, trace_id, part, k, sum(e - s) AS union_us, min(s) AS first_s, max(e) AS last_e
    FROM blocks GROUP BY ALL
)
"""


def has_trace_events(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether ``con`` has a ``trace_events`` view (or table) to read."""
    try:
        con.execute("SELECT 1 FROM trace_events LIMIT 0")
    except duckdb.Error:
        return False
    return True


def gpu_time_breakdown(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Per rank ``{"rank", "total_us", "idle_us", "compute_us", "non_compute_us"}``.

    Over the ``trace_events`` view of ``con``; sorted by rank; empty when there is no GPU
    activity (or no such view).
    """
    if not has_trace_events(con):
        return []
    rows = _breakdown(con, "0")
    for r in rows:
        del r["part"]
    return rows


def gpu_time_by_step(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Like :func:`gpu_time_breakdown`, per rank and profiler step (``"step"`` key).

    A step's activity is what its host side launched (``step`` of the kernel rows), measured
    from its first start to its last end, so the gap between steps is in neither. Activity
    with no step (no ProfilerStep in the trace) is left out.
    """
    if not has_trace_events(con):
        return []
    rows = _breakdown(con, "step", "step IS NOT NULL")
    for r in rows:
        r["step"] = r.pop("part")
    return rows


def _breakdown(con: duckdb.DuckDBPyConnection, part: str, where: str = "TRUE") -> list[dict]:
    keyed = (
        f"SELECT rank, trace_id, {part} AS part, 'busy' AS k, s, e FROM act WHERE {where} "
        f"UNION ALL SELECT rank, trace_id, {part} AS part, 'compute' AS k, s, e FROM act "
        f"WHERE ktype = 'computation' AND {where}"
    )
    sql = (
        activity_sql()
        + UNION_SQL.format(keyed=keyed)
        + """
, per_trace AS (
    SELECT b.rank, b.trace_id, b.part,
        b.last_e - b.first_s AS total_us,
        (b.last_e - b.first_s) - b.union_us AS idle_us,
        coalesce(c.union_us, 0) AS compute_us
    FROM unions b
    LEFT JOIN unions c ON c.rank = b.rank AND c.trace_id = b.trace_id AND c.part = b.part
                       AND c.k = 'compute'
    WHERE b.k = 'busy'
)
SELECT rank, part, sum(total_us), sum(idle_us), sum(compute_us)
FROM per_trace GROUP BY rank, part ORDER BY rank, part
"""
    )
    out = []
    for rank, part_value, total, idle, compute in con.execute(sql).fetchall():
        total, idle, compute = float(total), float(idle), float(compute)
        out.append(
            {
                "rank": int(rank),
                "part": part_value,
                "total_us": round(total, 3),
                "idle_us": round(idle, 3),
                "compute_us": round(compute, 3),
                # clamp: float round-off of the three sums must not make it -0.001
                "non_compute_us": round(max(total - compute - idle, 0.0), 3),
            }
        )
    return out


def kernel_breakdown(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Per rank × kernel type ``{"rank", "type", "total_us", "pct", "count"}``.

    ``total_us`` is the time during which at least one kernel of that type runs (union of its
    intervals over all streams, so overlapping kernels are not counted twice); ``pct`` is it
    as a percentage of the rank's GPU busy time. Types overlap in time (e.g. NCCL kernels
    under computation), so the percentages of a rank can add up to more than 100. The
    exclusive and overlap shares HTA plots follow from these by inclusion–exclusion.
    Types with no activity are left out; sorted by rank, then total_us descending.
    """
    if not has_trace_events(con):
        return []
    keyed = (
        "SELECT rank, trace_id, 0 AS part, 'busy' AS k, s, e FROM act "
        "UNION ALL SELECT rank, trace_id, 0 AS part, ktype AS k, s, e FROM act"
    )
    sql = (
        activity_sql()
        + UNION_SQL.format(keyed=keyed)
        + """
, counts AS (SELECT rank, ktype AS k, count(*) AS n FROM act GROUP BY ALL),
per_rank AS (SELECT rank, k, sum(union_us) AS us FROM unions GROUP BY ALL)
SELECT t.rank, t.k, t.us, 100.0 * t.us / nullif(b.us, 0), c.n
FROM per_rank t
JOIN per_rank b ON b.rank = t.rank AND b.k = 'busy'
JOIN counts c ON c.rank = t.rank AND c.k = t.k
WHERE t.k <> 'busy'
ORDER BY t.rank, t.us DESC
"""
    )
    return [
        {
            "rank": int(rank),
            "type": k,
            "total_us": round(float(us), 3),
            "pct": round(float(pct or 0.0), 2),
            "count": int(n),
        }
        for rank, k, us, pct, n in con.execute(sql).fetchall()
    ]
