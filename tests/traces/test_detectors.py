"""gpu_idle, host_sync and top_ops on real traces and on synthetic ones with known answers."""

from __future__ import annotations

import pytest
from trace_helpers import ALEXNET, CPU_ONLY, NCCL_NS, ROCM, SAMPLED, X, ctx_over, table_of
from tracealyze.analyzer.diagnosis import thresholds
from tracealyze.analyzer.diagnosis.detectors import gpu_idle, host_sync, top_ops
from tracealyze.analyzer.diagnosis.findings import FINDING_IDS
from tracealyze.analyzer.ingest.read import TRACE_EVENTS_SCHEMA, read_trace

DETECTORS = (gpu_idle, host_sync, top_ops)


def run(mod, path_or_table, **overrides):
    t = table_of(path_or_table) if not hasattr(path_or_table, "schema") else path_or_table
    return mod.detect(ctx_over(t), thresholds.of(mod, overrides))


def test_protocol() -> None:
    for mod in DETECTORS:
        assert mod.ID in FINDING_IDS and mod.__name__.rsplit(".", 1)[1] == mod.ID
        assert isinstance(mod.DEFAULTS, dict) and mod.DEFAULTS
        assert {"meaning", "rule", "fixes"} <= set(mod.DOC)


def test_no_trace_events_no_findings() -> None:
    empty = TRACE_EVENTS_SCHEMA.empty_table()
    for mod in DETECTORS:
        assert run(mod, empty) == []


def test_gpu_idle_flags_the_communication_bound_rank() -> None:
    (f,) = run(gpu_idle, SAMPLED)
    assert f.severity == "warning" and f.subject == "rank 0" and f.first_step == 551
    assert f.evidence["idle_pct"] == pytest.approx(55.21, abs=0.01)
    assert f.evidence["idle_us"] == pytest.approx(675191.0)
    assert [s["step"] for s in f.evidence["steps"]] == [551, 552]
    assert "55.2%" in f.message and "overlap" in f.advice  # comm > compute: overlap advice


def test_gpu_idle_quiet_on_a_busy_gpu_and_thresholds_apply() -> None:
    assert run(gpu_idle, NCCL_NS) == []  # 1.6% idle
    (f,) = run(gpu_idle, NCCL_NS, max_idle_pct=1.0)
    assert f.first_step == 101  # the warm-up step idles most (3.2%)
    assert run(gpu_idle, SAMPLED, max_idle_pct=60.0) == []
    (e,) = run(gpu_idle, SAMPLED, error_idle_pct=50.0)
    assert e.severity == "error"
    assert run(gpu_idle, ROCM, min_total_us=1e6) == []  # 9 ms toy trace: too little to judge


def test_gpu_idle_and_host_sync_silent_on_cpu_only_trace() -> None:
    assert run(gpu_idle, CPU_ONLY) == [] and run(host_sync, CPU_ONLY) == []


def test_host_sync_finds_item_calls_and_their_caller() -> None:
    (f,) = run(host_sync, SAMPLED)
    assert f.severity == "info"  # 1.5 per step, 0.01% of step time
    assert f.evidence["syncs"] == 3 and f.evidence["syncs_per_step"] == 1.5
    (site,) = f.evidence["sites"]
    assert site["sync"] == "aten::item" and site["op"] == "forward" and site["count"] == 3
    assert f.first_step == 551
    (w,) = run(host_sync, SAMPLED, max_syncs_per_step=1)
    assert w.severity == "warning"


def test_host_sync_runtime_syncs_without_profiler_steps() -> None:
    (f,) = run(host_sync, ALEXNET)
    ev = f.evidence
    # 5 cudaDeviceSynchronize + 16 cudaStreamSynchronize; cudaStreamWaitEvent is no host sync
    assert ev["syncs"] == 21 and ev["syncs_per_step"] is None and f.first_step is None
    sites = {s["sync"]: s for s in ev["sites"]}
    assert sites["cudaStreamSynchronize"]["op"] == "aten::copy_"
    assert "aten::to" in sites["cudaStreamSynchronize"]["stack"]


def test_host_sync_ignores_the_profilers_own_sync_outside_steps() -> None:
    # nccl trace: one 89 ms cudaDeviceSynchronize after the last ProfilerStep (profiler stop)
    assert run(host_sync, NCCL_NS) == []


def _item_step(step: int, t0: float, n_items: int, item_us: float) -> list[dict]:
    ev = [X("user_annotation", f"ProfilerStep#{step}", t0, 1000.0),
          X("cuda_runtime", "cudaLaunchKernel", t0 + 1, 2, correlation=step * 100),
          X("kernel", "gemm", t0 + 5, 100, pid=0, tid=7, stream=7, correlation=step * 100)]
    for i in range(n_items):
        ts = t0 + 10 + i * (item_us + 10)
        corr = step * 100 + i + 1
        ev += [X("cpu_op", "aten::item", ts, item_us),
               X("cpu_op", "aten::_local_scalar_dense", ts + 0.5, item_us - 1),
               X("cuda_runtime", "cudaMemcpyAsync", ts + 1, 2, correlation=corr),
               X("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", ts + 4, 1, pid=0, tid=7,
                 stream=7, correlation=corr),
               X("cuda_runtime", "cudaStreamSynchronize", ts + 3, item_us - 5)]
    return ev


def test_host_sync_counts_item_once_and_warns_per_step(write_trace) -> None:
    ev = _item_step(5, 0, 4, 50.0) + _item_step(6, 1000, 4, 50.0)
    (f,) = run(host_sync, read_trace(write_trace(ev)))
    # the memcpy + cudaStreamSynchronize inside each .item() are part of it, not extra syncs
    assert f.evidence["syncs"] == 8 and f.evidence["syncs_per_step"] == 4.0
    assert f.severity == "warning" and f.first_step == 5
    assert f.evidence["sites"][0]["sync"] == "aten::item"
    assert f.evidence["blocked_us"] == pytest.approx(8 * 49.0)
    assert "4× per step" in f.title


def test_host_sync_cpu_only_item_is_not_a_sync(write_trace) -> None:
    ev = [X("user_annotation", "ProfilerStep#1", 0, 100), X("cpu_op", "aten::item", 10, 5),
          X("cpu_op", "aten::_local_scalar_dense", 11, 3)]
    assert run(host_sync, read_trace(write_trace(ev))) == []


def test_top_ops_always_info_with_self_time(write_trace) -> None:
    ev = [X("cpu_op", "aten::linear", 0, 100),
          X("cpu_op", "aten::addmm", 10, 60),
          X("cuda_runtime", "cudaLaunchKernel", 20, 30, correlation=1),
          X("kernel", "sgemm", 40, 500, pid=0, tid=7, stream=7, correlation=1),
          X("cpu_op", "aten::relu", 200, 10, tid=2)]
    (f,) = run(top_ops, read_trace(write_trace(ev)))
    assert f.severity == "info" and f.subject == "sgemm"
    by = {o["name"]: o for o in f.evidence["cpu_ops_by_self"]}
    assert by["aten::linear"]["self_us"] == 40.0  # 100 - addmm 60
    assert by["aten::addmm"]["self_us"] == 30.0   # 60 - cudaLaunchKernel 30
    assert by["aten::relu"]["self_us"] == 10.0
    assert f.evidence["cpu_ops_by_total"][0]["name"] == "aten::linear"
    assert f.evidence["gpu_kernels"] == [
        {"name": "sgemm", "calls": 1, "total_us": 500.0, "pct": 100.0}]


@pytest.mark.parametrize("path", [NCCL_NS, SAMPLED, ALEXNET, CPU_ONLY, ROCM],
                         ids=lambda p: p.name)
def test_top_ops_on_real_traces(path) -> None:
    (f,) = run(top_ops, path, top_n=3)
    assert f.severity == "info"
    assert len(f.evidence["cpu_ops_by_self"]) <= 3
    for o in f.evidence["cpu_ops_by_self"]:
        assert 0 <= o["self_us"] <= o["total_us"] + 1e-6
    if path is SAMPLED:
        assert f.evidence["gpu_kernels"][0]["name"].startswith("ncclKernel_SendRecv")
