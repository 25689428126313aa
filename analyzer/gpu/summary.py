"""The ``gpu_time`` rows of ``summary --json`` (DESIGN.md): per rank, the temporal breakdown
(``gputime``) with Holistic Trace Analysis's other per-rank analyses folded in —
``comm_comp_overlap_pct`` (``gpu.overlap``), ``idle_breakdown`` per stream
(``gpu.idle``), ``launch`` statistics (``gpu.launch``) — and the same per profiled step
under ``steps``. One facade over the four analysis modules; each runs one query over all
ranks at once.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import duckdb

from .gputime import gpu_time_breakdown, gpu_time_by_step
from .idle import idle_breakdown
from .launch import launch_stats_both
from .memo import shared
from .overlap import comm_comp_overlap
from .overview import CATEGORIES, step_overview

_LAUNCH_KEYS = ("kernels", "short_kernels", "runtime_outliers", "launch_delay_outliers",
                "launch_delay_p50_us", "launch_delay_p99_us")
_IDLE_KEYS = ("host_wait_us", "kernel_wait_us", "other_us")


def _by(rows: list[dict[str, Any]], *keys: str) -> dict[tuple, list[dict[str, Any]]]:
    out: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[tuple(r[k] for k in keys)].append(r)
    return out


def _launch(row: dict[str, Any] | None) -> dict[str, Any]:
    if row is None:
        return {"kernels": 0, "short_kernels": 0, "runtime_outliers": 0,
                "launch_delay_outliers": 0}
    return {k: row[k] for k in _LAUNCH_KEYS}


_OVERVIEW_KEYS = (*(f"{c}_us" for c in CATEGORIES), "other_us", "gpu_busy_us")


def _overview(row: dict[str, Any] | None) -> dict[str, Any] | None:
    """The step's wall time split as the profiler plugin's overview (``gpu.overview``)."""
    if row is None:
        return None
    return {"step_us": row["total_us"], **{k: row[k] for k in _OVERVIEW_KEYS}}


def gpu_time_rows(con: duckdb.DuckDBPyConnection, *,
                  cache: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """DESIGN.md ``gpu_time``: one row per rank with GPU activity, sorted by rank.

    ``cache``: the detectors' shared results (``detectors.base.Context.cache``), so the
    analyses they already ran are not run again."""
    rows = shared(cache, con, gpu_time_breakdown)
    if not rows:
        return []
    overlap = {r["rank"]: r for r in comm_comp_overlap(con)}
    idle = _by(idle_breakdown(con), "rank")
    rank_launch, by_step_launch = launch_stats_both(con)
    launch = {r["rank"]: r for r in rank_launch}
    steps = _by(shared(cache, con, gpu_time_by_step), "rank")
    step_overlap = {(r["rank"], r["step"]): r for r in comm_comp_overlap(con, by_step=True)}
    step_idle = _by(idle_breakdown(con, by_step=True), "rank", "step")
    step_launch = {(r["rank"], r["step"]): r for r in by_step_launch}
    overview = {(r["rank"], r["step"]): r for r in shared(cache, con, step_overview)}
    out = []
    for r in rows:
        rank = r["rank"]
        o = overlap.get(rank)
        row = {
            **r,
            "comm_comp_overlap_pct": o["comm_comp_overlap_pct"] if o else None,
            "idle_breakdown": [{k: s[k] for k in ("stream", *_IDLE_KEYS)}
                               for s in idle.get((rank,), [])],
            "launch": _launch(launch.get(rank)),
            "steps": [],
        }
        for s in steps.get((rank,), []):
            key = (rank, s["step"])
            so = step_overlap.get(key)
            streams = step_idle.get(key, [])
            row["steps"].append({
                "step": s["step"],
                **{k: v for k, v in s.items() if k not in ("rank", "step")},
                "comm_comp_overlap_pct": so["comm_comp_overlap_pct"] if so else None,
                "idle_breakdown": [{k: x[k] for k in ("stream", *_IDLE_KEYS)} for x in streams],
                "launch": _launch(step_launch.get(key)),
                "overview": _overview(overview.get(key)),
            })
        out.append(row)
    return out
