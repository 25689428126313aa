"""Regenerate hta_reference.json: GPU time breakdown of the fixture traces by Holistic Trace
Analysis 0.5, the reference DESIGN.md's 'GPU time breakdown' is defined against.

HTA is not a dependency of tracealyze; run this in a throwaway venv:

    python -m venv /tmp/hta && /tmp/hta/bin/pip install 'HolisticTraceAnalysis==0.5.*'
    /tmp/hta/bin/python tests/data/traces/make_hta_reference.py

It runs HTA twice per trace: as shipped (ns-resolution timestamps rounded inwards to whole
microseconds: ts ceiled, end floored) and with HTA_DISABLE_NS_ROUNDING=1 (exact times).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GPU_TRACES = [
    "gpu_nccl_1rank_ns.pt.trace.json.gz",
    "gpu_sampled_rank0.json.gz",
    "gpu_alexnet_cuda_sync.json.gz",
    "amd_mi250_rocm.json.gz",
]


def one_mode() -> dict:
    """Run in a child process (the env flag is read at import time)."""
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis

    out = {}
    for name in GPU_TRACES:
        with tempfile.TemporaryDirectory() as d:
            shutil.copy(HERE / name, d)
            ta = TraceAnalysis(trace_dir=d, include_last_profiler_step=True)
            tb = ta.get_temporal_breakdown(visualize=False)
            kt, _ = ta.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)
            out[name] = {
                "temporal": [
                    {
                        "rank": int(r["rank"]),
                        "total_us": float(r["kernel_time(us)"]),
                        "idle_us": float(r["idle_time(us)"]),
                        "compute_us": float(r["compute_time(us)"]),
                        "non_compute_us": float(r["non_compute_time(us)"]),
                    }
                    for r in tb.to_dict(orient="records")
                ],
                # HTA splits busy time into exclusive and overlapping kernel-type labels.
                "kernel_type_us": {r["kernel_type"]: float(r["sum"])
                                   for r in kt.to_dict(orient="records")},
                **_analyses(ta),
            }
    return out


def _analyses(ta) -> dict:  # ta: hta's TraceAnalysis
    """HTA's idle-time breakdown, comm/comp overlap and launch stats on every rank."""
    ranks = sorted(int(r) for r in ta.t.traces)
    overlap = ta.get_comm_comp_overlap(visualize=False)
    idle, _ = ta.get_idle_time_breakdown(ranks=ranks, visualize=False)
    launch = ta.get_cuda_kernel_launch_stats(ranks=ranks, visualize=False)
    streams: dict = {}
    for r in idle.to_dict(orient="records"):
        key = f"{int(r['rank'])}/{int(r['stream'])}"
        streams.setdefault(key, {})[f"{r['idle_category']}_us"] = float(r["idle_time"])
    return {
        # HTA's column is named a percentage; NaN (no communication) becomes None
        "comm_comp_overlap_pct": {
            str(int(r["rank"])): (None if r["comp_comm_overlap_pctg"] != r["comp_comm_overlap_pctg"]
                                  else float(r["comp_comm_overlap_pctg"]))
            for r in overlap.to_dict(orient="records")
        },
        "idle_breakdown": streams,
        "launch": {
            str(rank): {
                "kernels": len(df),
                "short_kernels": int(((df.cpu_duration <= 50)
                                      & (df.gpu_duration < df.cpu_duration)).sum()),
                "runtime_outliers": int((df.cpu_duration > 50).sum()),
                "launch_delay_outliers": int((df.launch_delay > 100).sum()),
            }
            for rank, df in launch.items()
        },
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(one_mode()))
        return
    from importlib.metadata import version

    import hta  # noqa: F401 - fail early outside the HTA venv

    result = {
        "note": (
            "GPU time breakdown of the fixture traces computed by HolisticTraceAnalysis "
            f"{version('HolisticTraceAnalysis')} (TraceAnalysis(include_last_profiler_step=True)"
            ".get_temporal_breakdown / get_gpu_kernel_breakdown(include_memory_kernels=True)) "
            "and get_idle_time_breakdown / get_comm_comp_overlap / get_cuda_kernel_launch_stats "
            "(defaults, all ranks) with pandas " + version("pandas")
            + ", by tests/data/traces/make_hta_reference.py. "
            "'hta' is HTA as shipped (ns timestamps rounded inwards to whole us); "
            "'hta_exact' is HTA with HTA_DISABLE_NS_ROUNDING=1."
        ),
        "hta_version": version("HolisticTraceAnalysis"),
    }
    for key, env in (("hta", {}), ("hta_exact", {"HTA_DISABLE_NS_ROUNDING": "1"})):
        proc = subprocess.run(
            [sys.executable, __file__, "--child"],
            env={**os.environ, **env}, check=True, capture_output=True, text=True,
        )
        result[key] = json.loads(proc.stdout.strip().splitlines()[-1])
    (HERE / "hta_reference.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
