"""Holistic Trace Analysis 0.5, run live, and our own analyses, in one shape for comparing.

``hta_results(folder)`` runs HTA as DESIGN.md's reference does
(``TraceAnalysis(include_last_profiler_step=True)``) on every trace in ``folder``;
``our_results(paths)`` reads the same traces with tracealyze. Both return::

    {"temporal": {rank: {"total_us", "idle_us", "compute_us", "non_compute_us"}},
     "idle": {"rank/stream": {"host_wait_us", "kernel_wait_us", "other_us"}},
     "overlap": {rank: pct or None},
     "launch": {rank: {"kernels", "short_kernels", "runtime_outliers",
                       "launch_delay_outliers"}},
     "kernel_types": {"computation"|"communication"|"memory": union us, all ranks}}
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any


def hta_results(folder: Path) -> dict[str, Any]:
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis

    ta = TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True)
    ranks = sorted(int(r) for r in ta.t.traces)
    out: dict[str, Any] = {"temporal": {}, "idle": {}, "overlap": {}, "launch": {},
                           "kernel_types": {}}
    for r in ta.get_temporal_breakdown(visualize=False).to_dict(orient="records"):
        out["temporal"][int(r["rank"])] = {
            "total_us": float(r["kernel_time(us)"]), "idle_us": float(r["idle_time(us)"]),
            "compute_us": float(r["compute_time(us)"]),
            "non_compute_us": float(r["non_compute_time(us)"])}
    for r in ta.get_comm_comp_overlap(visualize=False).to_dict(orient="records"):
        pct = float(r["comp_comm_overlap_pctg"])
        out["overlap"][int(r["rank"])] = None if math.isnan(pct) else pct
    idle, _ = ta.get_idle_time_breakdown(ranks=ranks, visualize=False)
    for r in idle.to_dict(orient="records"):
        key = f"{int(r['rank'])}/{int(r['stream'])}"
        out["idle"].setdefault(key, {"host_wait_us": 0.0, "kernel_wait_us": 0.0,
                                     "other_us": 0.0})
        out["idle"][key][f"{r['idle_category']}_us"] = float(r["idle_time"])
    for rank, df in ta.get_cuda_kernel_launch_stats(ranks=ranks, visualize=False).items():
        out["launch"][int(rank)] = {
            "kernels": len(df),
            "short_kernels": int(((df.cpu_duration <= 50)
                                  & (df.gpu_duration < df.cpu_duration)).sum()),
            "runtime_outliers": int((df.cpu_duration > 50).sum()),
            "launch_delay_outliers": int((df.launch_delay > 100).sum())}
    # HTA labels busy time by the set of types running ('A overlapping B'); a type's union
    # is the sum of the labels that name it
    kt, _ = ta.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)
    for kind in ("COMPUTATION", "COMMUNICATION", "MEMORY"):
        got = sum(float(r["sum"]) for r in kt.to_dict(orient="records")
                  if kind in r["kernel_type"])
        if got:
            out["kernel_types"][kind.lower()] = got
    return out


def our_results(paths: list[Path]) -> dict[str, Any]:
    from trace_helpers import con_over
    from tracealyze.analyzer.gpu.gputime import gpu_time_breakdown, kernel_breakdown
    from tracealyze.analyzer.gpu.idle import idle_breakdown
    from tracealyze.analyzer.gpu.launch import launch_stats
    from tracealyze.analyzer.gpu.overlap import comm_comp_overlap
    from tracealyze.analyzer.ingest.read import read_trace

    con = con_over(*[read_trace(p) for p in paths])
    out: dict[str, Any] = {"temporal": {}, "idle": {}, "overlap": {}, "launch": {},
                           "kernel_types": {}}
    for r in gpu_time_breakdown(con):
        out["temporal"][r["rank"]] = {k: r[k] for k in
                                      ("total_us", "idle_us", "compute_us", "non_compute_us")}
    for r in idle_breakdown(con):
        out["idle"][f"{r['rank']}/{r['stream']}"] = {
            k: r[k] for k in ("host_wait_us", "kernel_wait_us", "other_us")}
    for r in comm_comp_overlap(con):
        out["overlap"][r["rank"]] = r["comm_comp_overlap_pct"]
    for r in launch_stats(con):
        out["launch"][r["rank"]] = {k: r[k] for k in (
            "kernels", "short_kernels", "runtime_outliers", "launch_delay_outliers")}
    for r in kernel_breakdown(con):
        if r["type"] != "other":
            kt = out["kernel_types"]
            kt[r["type"]] = kt.get(r["type"], 0.0) + r["total_us"]
    return out
