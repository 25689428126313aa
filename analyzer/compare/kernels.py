"""The GPU side of ``tracealyze compare``, when both runs hold profiler traces: per-step GPU
figures (``gpu_*``, ``kernel_*`` metrics), the GPU time breakdown of each run, and a diff of
kernels, ops and runtime calls (HTA's trace diff, joined with the steps).

Everything is normalised **per profiled step** (a ``ProfilerStep#N`` span of a rank), so two
runs that profiled a different number of steps compare like with like; traces without
ProfilerStep spans (a benchmark loop) are normalised per trace instead, and the diff says so.

A diff row is a (kind, name): ``kernel`` (GPU kernels, memcpy, memset), ``op`` (``cpu_op``
events: ``aten::item``, ``aten::mm``...), ``runtime`` (CUDA/HIP runtime and driver calls:
``cudaStreamSynchronize``, ``cudaLaunchKernel``...). Its status: ``added`` / ``removed``
(present in one run only), ``slower`` / ``faster`` (time per step moved by at least the
threshold and at least ``FLOOR_FRAC`` of the base's profiled step), ``more_calls`` /
``fewer_calls`` (same time, count per step moved by at least the threshold). Each row also
says what share of the step-time change it accounts for ("joined with the steps").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..gpu.gputime import STEP_SPAN, gpu_time_breakdown, gpu_time_by_step, has_trace_events
from ..gpu.vocabulary import GPU_ACTIVITY_SQL, KERNEL_SQL, LAUNCH_SQL
from .metrics import Metric
from .stats import shifted

KINDS_SQL = f"""CASE WHEN cat IN {GPU_ACTIVITY_SQL} THEN {KERNEL_SQL}
                    WHEN cat = 'cpu_op' THEN 'op'
                    WHEN cat IN {LAUNCH_SQL} THEN 'runtime' END"""
TOP_PER_KIND = 25
FLOOR_FRAC = 0.002     # a timing change under 0.2% of the base's profiled step is not listed
MIN_TESTED = 8         # per-step samples each side for the Mann-Whitney test
FEW_TEST = "all per-step values of one run beyond all of the other's (few profiled steps)"


@dataclass
class TraceData:
    """One run's trace figures, read once."""

    unit: str                       # "profiled step" | "trace"
    windows: int                    # profiled steps (rank × step) or traces
    step_wall_us: float | None      # mean ProfilerStep span (host side)
    per_step: dict[str, np.ndarray]  # samples per profiled step
    names: dict[tuple[str, str], tuple[float, float]]  # (kind, name) -> (total_us, count)
    breakdown: dict[str, float]     # GPU time breakdown per window (µs)

    @classmethod
    def load(cls, con: Any) -> TraceData | None:
        if not has_trace_events(con):
            return None
        (n_gpu,) = con.execute(
            f"SELECT count(*) FROM trace_events WHERE cat IN {GPU_ACTIVITY_SQL}").fetchone()
        if not n_gpu:
            return None
        spans = con.execute(
            f"SELECT count(*), avg(dur_us) FROM (SELECT DISTINCT rank, trace_id, name, dur_us "
            f"FROM trace_events WHERE {STEP_SPAN})"
        ).fetchone()
        by_step = spans[0] > 0
        if by_step:
            windows, wall = int(spans[0]), float(spans[1])
            key = "rank, trace_id, step"
            where = "step IS NOT NULL"
        else:
            (windows,) = con.execute(
                "SELECT count(DISTINCT (rank, trace_id)) FROM trace_events").fetchone()
            wall, key, where = None, "rank, trace_id", "TRUE"
        names = {(k, n): (float(us or 0.0), float(c)) for k, n, us, c in con.execute(
            f"SELECT {KINDS_SQL} AS kind, name, sum(dur_us), count(*) FROM trace_events "
            f"WHERE {where} AND kind IS NOT NULL GROUP BY ALL").fetchall()}
        k_rows = con.execute(
            f"SELECT sum(dur_us), count(*) FROM trace_events WHERE {where} AND cat IN "
            f"{GPU_ACTIVITY_SQL} GROUP BY {key}").fetchall()
        per_step = {"kernel_time_us": np.array([r[0] or 0.0 for r in k_rows], np.float64),
                    "kernel_launches": np.array([r[1] for r in k_rows], np.float64)}
        if by_step:
            rows = gpu_time_by_step(con)
            busy = np.array([r["total_us"] - r["idle_us"] for r in rows], np.float64)
            total = np.array([r["total_us"] for r in rows], np.float64)
            per_step["busy_us"] = busy
            with np.errstate(divide="ignore", invalid="ignore"):
                per_step["idle_share"] = np.where(total > 0, 1.0 - busy / total, np.nan)
        bd = gpu_time_breakdown(con)
        breakdown = {k: sum(r[k] for r in bd) / max(windows, 1)
                     for k in ("total_us", "idle_us", "compute_us", "non_compute_us")}
        return cls(unit="profiled step" if by_step else "trace", windows=max(windows, 1),
                   step_wall_us=wall, per_step=per_step, names=names, breakdown=breakdown)


def _judged(name: str, a: np.ndarray, b: np.ndarray, better: str,
            agg: Any = np.median) -> Metric | None:
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if not len(a) or not len(b):
        return None
    if len(a) >= MIN_TESTED and len(b) >= MIN_TESTED:
        sig, ev = shifted(a, b)
        test = "mann_whitney+effect"
    else:
        sig = bool(a.max() < b.min() or b.max() < a.min())
        ev, test = {"base_steps": len(a), "new_steps": len(b)}, FEW_TEST
    return Metric(name, float(agg(a)), float(agg(b)), better, sig, test=test, evidence=ev)


def gpu_metrics(a: TraceData, b: TraceData) -> list[Metric]:
    """Per-step GPU figures of both runs (only those both runs have)."""
    out = []
    for key, name, better in (("busy_us", "gpu_busy_us_per_step", "lower"),
                              ("idle_share", "gpu_idle_share", "lower"),
                              ("kernel_time_us", "kernel_time_us_per_step", "lower"),
                              ("kernel_launches", "kernel_launches_per_step", "lower")):
        if key in a.per_step and key in b.per_step:
            m = _judged(name, a.per_step[key], b.per_step[key], better)
            if m is not None:
                out.append(m)
    return out


def kernel_diff(a: TraceData, b: TraceData, threshold: float,
                step_change_us: float | None) -> dict[str, Any]:
    """Kernels, ops and runtime calls that were added, removed, got slower or faster, or are
    called more or less often, per profiled step; the largest time changes first."""
    floor = FLOOR_FRAC * (a.step_wall_us or a.breakdown.get("total_us") or 0.0)
    rel = threshold / 100.0
    rows: list[dict[str, Any]] = []
    for kind, name in a.names.keys() | b.names.keys():
        us_a, n_a = (v / a.windows for v in a.names.get((kind, name), (0.0, 0.0)))
        us_b, n_b = (v / b.windows for v in b.names.get((kind, name), (0.0, 0.0)))
        d_us = us_b - us_a
        if n_a == 0:
            status = "added"
        elif n_b == 0:
            status = "removed"
        elif abs(d_us) >= max(rel * us_a, floor) and abs(d_us) > 0:
            status = "slower" if d_us > 0 else "faster"
        elif abs(n_b - n_a) >= max(rel * n_a, 0.5):
            status = "more_calls" if n_b > n_a else "fewer_calls"
        else:
            continue
        row = {"kind": kind, "name": name, "status": status,
               "base_us_per_step": round(us_a, 3), "new_us_per_step": round(us_b, 3),
               "base_count_per_step": round(n_a, 3), "new_count_per_step": round(n_b, 3),
               "delta_us_per_step": round(d_us, 3)}
        if step_change_us and kind != "op":  # ops nest: their shares would add up twice
            row["share_of_step_change_pct"] = round(100.0 * d_us / step_change_us, 1)
        rows.append(row)
    rows.sort(key=lambda r: (-abs(r["delta_us_per_step"]), r["kind"], r["name"]))
    kept, per_kind = [], {}
    for r in rows:
        per_kind[r["kind"]] = per_kind.get(r["kind"], 0) + 1
        if per_kind[r["kind"]] <= TOP_PER_KIND:
            kept.append(r)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return {"unit": a.unit if a.unit == b.unit else "trace",
            "base_windows": a.windows, "new_windows": b.windows,
            "step_change_us": None if step_change_us is None else round(step_change_us, 3),
            "counts": counts, "rows": kept, "more": len(rows) - len(kept)}


def step_change_us(a: TraceData, b: TraceData, step_metric: Metric | None) -> float | None:
    """The step-time change (µs per step) the rows are joined with: the steps table's median
    when both runs have one, else the profiled steps' host span."""
    if step_metric is not None and step_metric.base and step_metric.new:
        return 1e6 * (step_metric.new - step_metric.base)
    if a.step_wall_us and b.step_wall_us:
        return b.step_wall_us - a.step_wall_us
    return None
