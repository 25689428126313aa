"""Idle time of each GPU stream, split by cause (Holistic Trace Analysis 0.5's
``get_idle_time_breakdown``, on every rank instead of rank 0 only).

Per stream, the GPU events (cat ``kernel``, ``gpu_memcpy``, ``gpu_memset``) are taken in start
order; the gap before each one (its start minus the end of what ran before it on that stream)
is idle time of one kind:

* ``host_wait``: the host called the launch (the ``cuda_runtime``/``cuda_driver`` event with
  the same ``correlation``) only after the stream had gone idle — the CPU did not enqueue
  work fast enough;
* ``kernel_wait``: otherwise, a gap shorter than ``consecutive_kernel_delay_us`` (30 us, as
  HTA) — the cost of launching back-to-back small kernels;
* ``other``: the rest (e.g. waiting on an event from another stream).

The rows are HTA's (:mod:`.htarows`). As in HTA, a stream's events are ordered by start and
each gap is to the end of the event just before (not the latest end so far): an event nested
in the one before (clock skew between host and device) gives a negative gap, counted as HTA
counts it. The order of two events of one stream that start at the same time is not defined
in HTA (numpy's unstable sort); here the shorter comes first. A rank's figures are the sums
over its traces; per step, a gap counts in the step of the event that ends it.
"""

from __future__ import annotations

from typing import Any

import duckdb

from .gputime import activity_sql, has_trace_events
from .vocabulary import GPU_ACTIVITY_SQL

KERNEL_DELAY_US = 30.0

_SQL = f"""
, g AS (
    -- HTA orders a stream's events by start and takes the gap to the end of the one just
    -- before (not the latest end so far: an event inside its predecessor gives a negative
    -- gap, which HTA adds up too)
    SELECT *, lag(e) OVER (PARTITION BY rank, trace_id, stream ORDER BY s, e) AS prev_end
    FROM act WHERE cat IN {GPU_ACTIVITY_SQL}
),
c AS (
    SELECT rank, {{part}} AS part, stream, coalesce(s - prev_end, 0) AS gap,
        CASE WHEN launched > prev_end THEN 'host_wait'
             WHEN s - prev_end < ? THEN 'kernel_wait'
             ELSE 'other' END AS kind
    FROM g WHERE {{where}}  -- a stream's first event has no gap, but lists the stream
)
SELECT rank, part, stream,
    coalesce(sum(gap) FILTER (WHERE kind = 'host_wait'), 0),
    coalesce(sum(gap) FILTER (WHERE kind = 'kernel_wait'), 0),
    coalesce(sum(gap) FILTER (WHERE kind = 'other'), 0)
FROM c GROUP BY ALL ORDER BY rank, part, stream
"""


def idle_breakdown(con: duckdb.DuckDBPyConnection, *, by_step: bool = False,
                   consecutive_kernel_delay_us: float = KERNEL_DELAY_US) -> list[dict[str, Any]]:
    """Per rank (and ``step`` with ``by_step``) and stream:
    ``{"rank", "stream", "host_wait_us", "kernel_wait_us", "other_us"}``.

    Sorted by rank, step, stream; empty without GPU events. With ``by_step``, events launched
    outside any ProfilerStep are left out.
    """
    if not has_trace_events(con):
        return []
    part, where = ("step", "step IS NOT NULL") if by_step else ("0", "TRUE")
    sql = (activity_sql()
           + _SQL.replace("{part}", part).replace("{where}", where))
    out = []
    for rank, p, stream, host, kernel, other in con.execute(
            sql, [float(consecutive_kernel_delay_us)]).fetchall():
        row: dict[str, Any] = {"rank": int(rank)}
        if by_step:
            row["step"] = int(p)
        row.update(stream=int(stream), host_wait_us=round(float(host), 3),
                   kernel_wait_us=round(float(kernel), 3), other_us=round(float(other), 3))
        out.append(row)
    return out
