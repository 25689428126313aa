"""The TensorBoard profiler plugin's step-time overview, back: each profiled step's wall time
(its ``ProfilerStep#N`` span on the host) split so that every moment counts once, under the
first of these that is happening then:

    kernel > memcpy > memset > communication > runtime > data loader > CPU exec > other

* kernel: GPU kernels other than communication; memcpy / memset: GPU copies and fills;
* communication: NCCL kernels, and host-side collectives (``nccl:*``, ``c10d::*``,
  ``record_param_comms``) while no kernel runs;
* runtime: CUDA/HIP runtime and driver calls on the host;
* data loader: host ops of a DataLoader (``enumerate(DataLoader)...``);
* CPU exec: other host ops and annotations; other: the rest of the step.

Time of category k = |union of intervals of categories ≤ k| − |same for < k|, each union
computed like the GPU time breakdown (window functions, no Python loop), over intervals
clipped to the step's span. GPU and host times of one rank share Kineto's clock.
"""

from __future__ import annotations

from typing import Any

import duckdb

from .gputime import COMM_RE, STEP_SPAN, UNION_SQL, has_trace_events
from .vocabulary import (
    GPU_ACTIVITY_SQL,
    KERNEL_SQL,
    LAUNCH_SQL,
    MEMCPY_SQL,
    MEMSET_SQL,
    OVERVIEW,
)

CATEGORIES = OVERVIEW

_SQL = f"""
WITH spans AS (
    SELECT rank, trace_id, step, min(ts_us) AS s0, max(ts_us + dur_us) AS s1
    FROM trace_events
    WHERE step IS NOT NULL AND {STEP_SPAN}
    GROUP BY ALL
),
iv AS (
    SELECT rank, trace_id, ts_us AS s, ts_us + dur_us AS e,
        CASE
            WHEN cat = {KERNEL_SQL} AND regexp_matches(name, '{COMM_RE}') THEN 4
            WHEN cat = {KERNEL_SQL} THEN 1
            WHEN cat = {MEMCPY_SQL} THEN 2
            WHEN cat = {MEMSET_SQL} THEN 3
            WHEN cat IN ('cpu_op', 'user_annotation')
                 AND (name LIKE 'nccl:%' OR name LIKE 'c10d::%'
                      OR name = 'record_param_comms') THEN 4
            WHEN cat IN {LAUNCH_SQL} THEN 5
            WHEN cat IN ('cpu_op', 'user_annotation', 'python_function')
                 AND name ILIKE '%DataLoader%' THEN 6
            WHEN cat IN ('cpu_op', 'user_annotation') AND name NOT LIKE 'ProfilerStep#%'
                THEN 7
        END AS p,
        cat IN {GPU_ACTIVITY_SQL} AS on_gpu
    FROM trace_events
    WHERE dur_us > 0
),
clipped AS (
    SELECT sp.rank, sp.trace_id, sp.step AS part, iv.p, iv.on_gpu,
        greatest(iv.s, sp.s0) - sp.s0 AS s, least(iv.e, sp.s1) - sp.s0 AS e
    FROM iv JOIN spans sp
      ON sp.rank = iv.rank AND sp.trace_id = iv.trace_id AND iv.e > sp.s0 AND iv.s < sp.s1
    WHERE iv.p IS NOT NULL
),
levels AS (SELECT unnest(range(1, 8)) AS k)
"""

# level k: the categories up to k; level 0: GPU activity alone (the GPU's busy time)
_KEYED = ("SELECT c.rank, c.trace_id, c.part, l.k, c.s, c.e "
          "FROM clipped c JOIN levels l ON c.p <= l.k "
          "UNION ALL SELECT rank, trace_id, part, 0, s, e FROM clipped WHERE on_gpu")

_TAIL = """
SELECT u.rank, u.part, u.k, u.union_us, sp.s1 - sp.s0
FROM unions u JOIN spans sp ON sp.rank = u.rank AND sp.trace_id = u.trace_id AND sp.step = u.part
ORDER BY u.rank, u.part, u.k
"""


def step_overview(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Per rank and profiled step: ``{"rank", "step", "total_us", "<category>_us" for each
    of CATEGORIES, "other_us", "gpu_busy_us"}`` (the categories and other add up to total;
    gpu_busy_us: time with any GPU activity, communication kernels included). Steps of
    several traces with the same number on one rank are summed. Empty without ProfilerStep
    spans."""
    if not has_trace_events(con):
        return []
    sql = _SQL + UNION_SQL.format(keyed=_KEYED) + _TAIL
    acc: dict[tuple[int, int], dict[str, Any]] = {}
    cum: dict[tuple[int, int, int], float] = {}
    spans: dict[tuple[int, int], float] = {}
    for rank, step, k, union_us, span in con.execute(sql).fetchall():
        key = (int(rank), int(step))
        cum[(*key, int(k))] = cum.get((*key, int(k)), 0.0) + float(union_us)
        spans[key] = float(span)
    for (rank, step), span in spans.items():
        row: dict[str, Any] = {"rank": rank, "step": step, "total_us": round(span, 3)}
        prev = 0.0
        for k, name in enumerate(CATEGORIES, start=1):
            u = max(cum.get((rank, step, k), prev), prev)  # a level with no rows adds nothing
            row[f"{name}_us"] = round(u - prev, 3)
            prev = u
        row["other_us"] = round(max(span - prev, 0.0), 3)
        row["gpu_busy_us"] = round(cum.get((rank, step, 0), 0.0), 3)
        acc[(rank, step)] = row
    return [acc[k] for k in sorted(acc)]
