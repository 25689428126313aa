"""The profiler plugin's step-time overview (each moment counted once, by priority) and its
seven recommendations, on hand-built traces whose answers are known."""

from __future__ import annotations

from pathlib import Path

import pytest
from trace_helpers import CPU_ONLY, SAMPLED, X, con_over, table_of
from tracealyze.analyzer.diagnosis.summary import build_summary
from tracealyze.analyzer.gpu.advice import recommendations
from tracealyze.analyzer.gpu.gputime import gpu_time_breakdown
from tracealyze.analyzer.gpu.overview import CATEGORIES, step_overview
from tracealyze.analyzer.ingest.importer import import_traces
from tracealyze.analyzer.ingest.read import read_trace

from tests.runfactory import make_run


def _k(name: str, ts: float, dur: float, corr: int, *, cat: str = "kernel", device: int = 0,
       pid: int = 0) -> dict:
    return X(cat, name, ts, dur, pid=pid, tid=7, stream=7, correlation=corr, device=device)


def _step(n: int, ts: float, dur: float) -> dict:
    return X("user_annotation", f"ProfilerStep#{n}", ts, dur)


def test_each_moment_counts_once_under_the_first_category(write_trace) -> None:
    ev = [
        _step(1, 0, 100),
        X("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
          0, 5),
        X("cuda_runtime", "cudaLaunchKernel", 5, 7, correlation=1),    # 10-12 under the kernel
        _k("sm80_xmma_gemm_bf16", 10, 30, 1),                          # kernel 10-40
        X("cpu_op", "aten::add", 40, 20),                              # CPU exec 40-50
        _k("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 50, 20, 2),    # communication 50-70
        X("cpu_op", "aten::mul", 120, 10),                             # outside the step
    ]
    (row,) = step_overview(con_over(read_trace(write_trace(ev))))
    assert row == {"rank": 0, "step": 1, "total_us": 100.0, "kernel_us": 30.0,
                   "memcpy_us": 0.0, "memset_us": 0.0, "communication_us": 20.0,
                   "runtime_us": 5.0, "dataloader_us": 5.0, "cpu_exec_us": 10.0,
                   "other_us": 30.0, "gpu_busy_us": 50.0}


def test_overview_adds_up_on_a_real_trace() -> None:
    rows = step_overview(con_over(table_of(SAMPLED)))
    assert [r["step"] for r in rows] == [551, 552]
    for r in rows:
        parts = sum(r[f"{c}_us"] for c in CATEGORIES) + r["other_us"]
        assert parts == pytest.approx(r["total_us"], abs=0.01)
        assert r["communication_us"] > 0.2 * r["total_us"]   # the NCCL SendRecv steps


def _ids(con, overview=None, gpu=None) -> dict[str, dict]:
    overview = step_overview(con) if overview is None else overview
    gpu = gpu_time_breakdown(con) if gpu is None else gpu
    return {r["id"]: r for r in recommendations(con, overview, gpu)}


def test_recommendations_fire_on_their_numbers(write_trace) -> None:
    ev = [
        _step(1, 0, 1000),
        X("cpu_op", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 0, 100),
        _k("volta_sgemm_128x64_nn", 100, 200, 1, device=0),            # fp32 GEMM, no TC
        _k("volta_sgemm_128x64_nn", 100, 200, 2, device=1),            # a 2nd GPU, same pid
        X("cpu_op", "gloo:all_reduce", 400, 300),
    ]
    got = _ids(con_over(read_trace(write_trace(ev))))
    assert set(got) == {"dataloader", "data_parallel", "ddp_without_nccl",
                        "low_gpu_utilization", "tensor_cores_unused"}
    assert got["dataloader"]["value"] == pytest.approx(10.0)      # 100 of 1000 us
    assert got["data_parallel"]["value"] == 2
    assert got["tensor_cores_unused"]["value"] == pytest.approx(100.0)
    assert got["low_gpu_utilization"]["value"] == pytest.approx(20.0)  # 200 of 1000 us


def test_a_busy_bf16_step_gets_no_recommendation(write_trace) -> None:
    ev = [_step(1, 0, 100), X("cuda_runtime", "cudaLaunchKernel", 0, 2, correlation=1),
          _k("sm90_xmma_gemm_bf16bf16_bf16f32", 2, 96, 1)]
    assert _ids(con_over(read_trace(write_trace(ev)))) == {}


def test_a_cpu_only_trace_gets_no_gpu_utilization_advice() -> None:
    """No GPU in the trace: its 0% GPU-busy share is not "low utilisation" (the summary of
    a CPU-only Trainer run said "the GPU is busy 0.0%: a larger batch size ...")."""
    assert "low_gpu_utilization" not in _ids(con_over(read_trace(CPU_ONLY)))


def test_communication_and_memory_recommendations(tmp_path: Path) -> None:
    gib = 2**30
    run = make_run(tmp_path, steps=40, cuda_allocated=30 * gib, cuda_reserved=38 * gib,
                   cuda_total=40 * gib)
    import_traces([SAMPLED], run)
    s = build_summary(run)
    (top,) = [f for f in s["findings"] if f["id"] == "top_ops"]
    recs = {r["id"]: r for r in top["evidence"]["recommendations"]}
    assert recs["communication"]["value"] > 10
    assert recs["memory_near_capacity"]["value"] == pytest.approx(95.0, abs=0.5)
    assert "Communication takes" in top["message"]
    steps = s["gpu_time"][0]["steps"]
    assert all(st["overview"]["step_us"] > 0 for st in steps)
