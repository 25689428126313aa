"""Why a GPU sat idle (``gpu_idle``'s ``evidence.cause``): the host waiting on it, the host
not launching work fast enough, or the input pipeline (issue 44: a healthy transformer too
small for its GPU was said to be idle "as a consequence of host_sync" when it had no sync).

Each idle interval of a rank (nothing running on any stream, between its first and last GPU
activity, per trace) is attributed by what the host was doing when the GPU ran dry:

* ``host_sync``: the interval **began while the host was blocked in a sync**
  (:mod:`.syncs`): the queue drained because the host waited. Cause when such intervals are
  at least :data:`SHARE` of the idle time.
* ``input_bound``: the profiled steps' data-loading time (the step overview's dataloader
  time) is at least :data:`SHARE` of their idle time.
* ``launch_bound``: the host cannot launch kernels as fast as the GPU runs them: in Holistic
  Trace Analysis's idle breakdown, gaps that end with a kernel launched only after the
  stream went dry (``host_wait``) or short gaps between back-to-back kernels
  (``kernel_wait``) are at least :data:`SHARE` of it, **and** the median kernel is shorter
  than the median launch call (each kernel is done before the next one is enqueued). The
  evidence says how: kernels per step, the two medians, and the host's op time per step.
* ``unknown`` otherwise: e.g. long kernels with the host away between them (work on the
  host that no category above names); the figures are in the evidence all the same.

The order is the causal one: a sync or a data wait explains launches that came late, not the
other way round.
"""

from __future__ import annotations

from typing import Any

import duckdb

from .gputime import activity_sql, has_trace_events
from .idle import idle_breakdown
from .overview import step_overview
from .vocabulary import GPU_ACTIVITY_SQL, GPU_SIDE_SQL, KERNEL_SQL, LAUNCH_SQL

SHARE = 0.5
"""A cause must account for at least half of the idle time: then it is the largest one."""

_GAPS_SQL = activity_sql() + f"""
, o AS (
    SELECT rank, trace_id, s, e,
        max(e) OVER (PARTITION BY rank, trace_id ORDER BY s, e
                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS busy_until
    FROM act WHERE cat IN {GPU_ACTIVITY_SQL}
)
SELECT o.rank, o.trace_id, z.t0 + o.busy_until AS gap_start, o.s - o.busy_until AS gap
FROM o JOIN t0 z USING (rank, trace_id)  -- (activity_sql's trace starts: back to absolute)
WHERE o.s > o.busy_until
"""

_LAUNCH_SQL = f"""
WITH steps AS (
    SELECT rank, count(DISTINCT (trace_id, name)) AS n FROM trace_events
    WHERE name LIKE 'ProfilerStep#%' AND cat NOT IN {GPU_SIDE_SQL} GROUP BY rank
)
, k AS (
    SELECT t.*, s.n,
        -- host ops not nested in another (their durations add up to the host's op time)
        max(t.ts_us + t.dur_us) FILTER (WHERE t.cat = 'cpu_op') OVER (
            PARTITION BY t.rank, t.trace_id, t.pid, t.tid, t.cat = 'cpu_op'
            ORDER BY t.ts_us, t.dur_us DESC
            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS ops_until
    FROM trace_events t LEFT JOIN steps s USING (rank)
    WHERE (t.step IS NOT NULL OR s.n IS NULL)
      AND (t.cat IN ({KERNEL_SQL}, 'cpu_op') OR t.cat IN {LAUNCH_SQL})
)
SELECT rank, any_value(n),
    count(*) FILTER (WHERE cat = {KERNEL_SQL}),
    median(dur_us) FILTER (WHERE cat = {KERNEL_SQL}),
    median(dur_us) FILTER (WHERE cat IN {LAUNCH_SQL} AND name LIKE '%Launch%'),
    sum(dur_us) FILTER (WHERE cat = 'cpu_op' AND (ops_until IS NULL OR ts_us >= ops_until))
FROM k GROUP BY rank
"""


def _sync_idle(con: duckdb.DuckDBPyConnection, sites: list[tuple]) -> dict[int, float]:
    """Per rank: idle time in intervals that began while the host was blocked in a sync."""
    if not sites:
        return {}
    import pyarrow as pa

    table = pa.table({
        "rank": pa.array([s[0] for s in sites], pa.int64()),
        "trace_id": pa.array([s[1] for s in sites], pa.string()),
        "a": pa.array([float(s[5]) for s in sites], pa.float64()),
        "b": pa.array([float(s[5]) + float(s[6]) for s in sites], pa.float64()),
    })
    con.register("_idle_sync_sites", table)
    try:
        rows = con.execute(f"""
            WITH gaps AS ({_GAPS_SQL})
            SELECT g.rank, sum(g.gap) FROM gaps g
            WHERE EXISTS (SELECT 1 FROM _idle_sync_sites x
                          WHERE x.rank = g.rank AND x.trace_id = g.trace_id
                            AND g.gap_start >= x.a AND g.gap_start <= x.b)
            GROUP BY g.rank""").fetchall()
    finally:
        con.unregister("_idle_sync_sites")
    return {int(r): float(v or 0.0) for r, v in rows}


def idle_causes(con: duckdb.DuckDBPyConnection, breakdown: list[dict[str, Any]],
                sites: list[tuple]) -> dict[int, dict[str, Any]]:
    """Per rank of ``breakdown`` (:func:`.gputime.gpu_time_breakdown` rows): ``{"cause",
    ...the figures it rests on}``."""
    if not breakdown or not has_trace_events(con):
        return {}
    sync_idle = _sync_idle(con, sites)
    waits: dict[int, list[float]] = {}
    for r in idle_breakdown(con):
        w = waits.setdefault(r["rank"], [0.0, 0.0, 0.0])
        w[0] += r["host_wait_us"]
        w[1] += r["kernel_wait_us"]
        w[2] += r["other_us"]
    data: dict[int, float] = {}
    for s in step_overview(con):
        data[s["rank"]] = data.get(s["rank"], 0.0) + float(s.get("dataloader_us") or 0.0)
    launch = {int(r[0]): r[1:] for r in con.execute(_LAUNCH_SQL).fetchall()}
    out = {}
    for b in breakdown:
        rank, idle = b["rank"], float(b["idle_us"])
        n_steps, kernels, kernel_med, launch_med, cpu_us = launch.get(rank, (None,) * 5)
        host_wait, kernel_wait, other = waits.get(rank, (0.0, 0.0, 0.0))
        gaps = host_wait + kernel_wait + other
        ev: dict[str, Any] = {
            "sync_idle_us": round(sync_idle.get(rank, 0.0), 3),
            "data_wait_us": round(data.get(rank, 0.0), 3),
            "host_wait_us": round(host_wait, 3), "kernel_wait_us": round(kernel_wait, 3),
            "kernels_per_step": round(kernels / n_steps, 1) if kernels and n_steps else None,
            "median_kernel_us": round(float(kernel_med), 3) if kernel_med is not None else None,
            "median_launch_us": round(float(launch_med), 3) if launch_med is not None else None,
            "cpu_op_us_per_step": round(float(cpu_us) / n_steps, 1)
            if cpu_us is not None and n_steps else None,
        }
        if idle > 0 and ev["sync_idle_us"] >= SHARE * idle:
            cause = "host_sync"
        elif idle > 0 and data and ev["data_wait_us"] >= SHARE * idle:
            cause = "input_bound"
        elif gaps > 0 and host_wait + kernel_wait >= SHARE * gaps and \
                kernel_med is not None and launch_med is not None and kernel_med < launch_med:
            cause = "launch_bound"
        else:
            cause = "unknown"
        out[rank] = {"cause": cause, **ev}
    return out
