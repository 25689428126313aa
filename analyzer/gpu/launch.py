"""Kernel launch statistics (Holistic Trace Analysis 0.5's ``get_cuda_kernel_launch_stats``,
on every rank instead of rank 0 only, and per profiled step).

Each launch call (``cudaLaunchKernel``, ``cudaLaunchKernelExC``, ``cudaMemcpyAsync``,
``cudaMemsetAsync``, as HTA; and, unlike HTA, their HIP counterparts, so ROCm traces are not
reported as launching nothing) gives its correlation id; as HTA, every CPU event with that
id is joined to every GPU-side event with it (HTA's rows, :mod:`.htarows`):

* ``kernels``: launches with their GPU event in the trace;
* ``short_kernels``: GPU time shorter than its launch call, where the call itself took at
  most ``runtime_cutoff_us`` (50 us) — kernels too small to pay for their launch;
* ``runtime_outliers``: launch calls longer than ``runtime_cutoff_us``;
* ``launch_delay_outliers``: GPU start − launch call end (clipped at 0) over
  ``launch_delay_cutoff_us`` (100 us) — the queue in front of the GPU;
* ``launch_delay_p50_us`` / ``launch_delay_p99_us``.
"""

from __future__ import annotations

from typing import Any

import duckdb

from .gputime import has_trace_events
from .htarows import ROWS_SQL

RUNTIME_CUTOFF_US = 50.0
LAUNCH_DELAY_CUTOFF_US = 100.0
LAUNCH_CALLS = (
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync",
    "hipLaunchKernel", "hipExtLaunchKernel", "hipExtModuleLaunchKernel",
    "hipModuleLaunchKernel", "hipMemcpyAsync", "hipMemsetAsync",
)

_SQL = ROWS_SQL + """
, launched AS (  -- HTA: the correlations of the launch calls ...
    SELECT DISTINCT rank, trace_id, corr FROM hta WHERE name IN ({names}) AND corr >= 0
),
calls AS (  -- ... then every CPU event and every GPU event with one of them
    SELECT h.rank, h.trace_id, h.step, h.corr, h.ts_us AS s, h.dur_us AS d
    FROM hta h SEMI JOIN launched l
        ON l.rank = h.rank AND l.trace_id = h.trace_id AND l.corr = h.corr
    WHERE h.hstream = -1
),
done AS (
    SELECT h.rank, h.trace_id, h.corr, h.ts_us AS s, h.dur_us AS d
    FROM hta h SEMI JOIN launched l
        ON l.rank = h.rank AND l.trace_id = h.trace_id AND l.corr = h.corr
    WHERE h.hstream <> -1
),
j AS (  -- no shift to the trace start needed: the difference of two timestamps is exact
    SELECT c.rank, c.step AS part, c.d AS cpu_us, g.d AS gpu_us,
        greatest(g.s - c.s - c.d, 0) AS delay
    FROM calls c JOIN done g
      ON g.rank = c.rank AND g.trace_id = c.trace_id AND g.corr = c.corr
)
SELECT rank, part, grouping(part) AS whole, count(*),
    count(*) FILTER (WHERE cpu_us <= $runtime AND gpu_us < cpu_us),
    count(*) FILTER (WHERE cpu_us > $runtime),
    count(*) FILTER (WHERE delay > $delay),
    quantile_cont(delay, 0.5), quantile_cont(delay, 0.99)
FROM j GROUP BY GROUPING SETS ((rank), (rank, part)) ORDER BY rank, part NULLS FIRST
"""


def launch_stats(con: duckdb.DuckDBPyConnection, *, by_step: bool = False,
                 runtime_cutoff_us: float = RUNTIME_CUTOFF_US,
                 launch_delay_cutoff_us: float = LAUNCH_DELAY_CUTOFF_US) -> list[dict[str, Any]]:
    """Per rank (and ``step`` with ``by_step``, the launching call's step) that launches:
    ``{"rank", "kernels", "short_kernels", "runtime_outliers", "launch_delay_outliers",
    "launch_delay_p50_us", "launch_delay_p99_us"}``. Sorted."""
    ranks, steps = launch_stats_both(con, runtime_cutoff_us=runtime_cutoff_us,
                                     launch_delay_cutoff_us=launch_delay_cutoff_us)
    return steps if by_step else ranks


def launch_stats_both(con: duckdb.DuckDBPyConnection, *,
                      runtime_cutoff_us: float = RUNTIME_CUTOFF_US,
                      launch_delay_cutoff_us: float = LAUNCH_DELAY_CUTOFF_US
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(per rank, per rank and step) of :func:`launch_stats` from one pass."""
    if not has_trace_events(con):
        return [], []
    names = ", ".join(f"'{n}'" for n in LAUNCH_CALLS)
    sql = _SQL.replace("{names}", names)
    params = {"runtime": float(runtime_cutoff_us), "delay": float(launch_delay_cutoff_us)}
    ranks: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    for rank, p, whole, n, short, rt_out, delay_out, p50, p99 in con.execute(
            sql, params).fetchall():
        row: dict[str, Any] = {"rank": int(rank)}
        if not whole:
            if p is None:  # launches outside any ProfilerStep: only in the rank's figures
                continue
            row["step"] = int(p)
        row.update(kernels=int(n), short_kernels=int(short), runtime_outliers=int(rt_out),
                   launch_delay_outliers=int(delay_out),
                   launch_delay_p50_us=round(float(p50), 3),
                   launch_delay_p99_us=round(float(p99), 3))
        (ranks if whole else steps).append(row)
    return ranks, steps
