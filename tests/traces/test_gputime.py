"""GPU time breakdown: agreement with Holistic Trace Analysis 0.5 and exact small cases."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import duckdb
import pytest
from trace_helpers import ALEXNET, CPU_ONLY, GPU_TRACES, X, con_over, table_of
from tracealyze.analyzer.gpu.gputime import gpu_time_breakdown, gpu_time_by_step, kernel_breakdown
from tracealyze.analyzer.ingest.read import read_trace

KEYS = ("total_us", "idle_us", "compute_us", "non_compute_us")
_ids = [p.name for p in GPU_TRACES]


def _ours(path: Path) -> dict:
    (row,) = gpu_time_breakdown(con_over(table_of(path)))
    return row


@pytest.mark.parametrize("path", GPU_TRACES, ids=_ids)
@pytest.mark.parametrize("mode", ["hta", "hta_exact"])
def test_agrees_with_hta_within_one_percent_of_total(path, mode, hta_reference) -> None:
    (ref,) = hta_reference[mode][path.name]["temporal"]
    ours = _ours(path)
    assert ours["rank"] == ref["rank"]
    for k in KEYS:
        assert abs(ours[k] - ref[k]) <= 0.01 * ref["total_us"], (k, ours[k], ref[k])
    assert sum(ours[k] for k in ("idle_us", "compute_us", "non_compute_us")) == pytest.approx(
        ours["total_us"], rel=1e-9)


@pytest.mark.parametrize("path", GPU_TRACES, ids=_ids)
def test_matches_hta_exactly_without_its_ns_rounding(path, hta_reference) -> None:
    # HTA as shipped rounds ns timestamps inwards to whole us (ts ceiled, end floored), which
    # turns back-to-back kernels into idle gaps; with that off the numbers are the same.
    (ref,) = hta_reference["hta_exact"][path.name]["temporal"]
    ours = _ours(path)
    for k in KEYS:
        assert ours[k] == pytest.approx(ref[k], abs=1e-4 * ref["total_us"]), k


def test_sync_events_on_the_device_count_as_hta_counts_them() -> None:
    # HTA's GPU side is every event with a stream: the AlexNet trace's device-wide 'Context
    # Sync' (stream 0xFFFFFFFF) ends the window, and its 'Stream Sync'/'Stream Wait Event'
    # rows (names without Memcpy/Memset/Sync... 'Stream Wait Event' has none) are busy time.
    con = con_over(table_of(ALEXNET))
    (ours,) = gpu_time_breakdown(con)
    (first, end) = con.execute(
        "SELECT min(ts_us), max(ts_us + dur_us) FROM trace_events WHERE cat IN "
        "('kernel', 'gpu_memcpy', 'gpu_memset', 'cuda_sync')").fetchone()
    act_end = con.execute("SELECT max(ts_us + dur_us) FROM trace_events WHERE cat IN "
                          "('kernel', 'gpu_memcpy', 'gpu_memset')").fetchone()[0]
    assert end - act_end > 70_000  # the final synchronize: 75.8 ms past the last kernel
    assert ours["total_us"] == pytest.approx(end - first, abs=1.0)


@pytest.mark.parametrize("path", GPU_TRACES, ids=_ids)
def test_kernel_type_union_matches_hta(path, hta_reference) -> None:
    # HTA splits busy time into exclusive and 'A overlapping B' labels; a type's union is the
    # sum of the labels that name it.
    ref = hta_reference["hta_exact"][path.name]["kernel_type_us"]
    total = hta_reference["hta_exact"][path.name]["temporal"][0]["total_us"]
    ours = {r["type"]: r for r in kernel_breakdown(con_over(table_of(path)))}
    for kind in ("COMPUTATION", "COMMUNICATION", "MEMORY"):
        want = sum(v for label, v in ref.items() if kind in label)
        got = ours.get(kind.lower(), {"total_us": 0.0})["total_us"]
        assert abs(got - want) <= 0.01 * total, (kind, got, want)


def test_kernel_breakdown_shares_of_busy_time() -> None:
    rows = kernel_breakdown(con_over(table_of(GPU_TRACES[1])))  # sampled: NCCL under compute
    by = {r["type"]: r for r in rows}
    assert set(by) == {"communication", "computation", "memory"}
    assert by["communication"]["count"] == 10
    assert sum(r["pct"] for r in rows) > 100  # types overlap in time
    (g,) = gpu_time_breakdown(con_over(table_of(GPU_TRACES[1])))
    busy = g["total_us"] - g["idle_us"]
    assert by["computation"]["total_us"] == pytest.approx(g["compute_us"])
    assert by["communication"]["pct"] == pytest.approx(
        100 * by["communication"]["total_us"] / busy, abs=0.01)


def _launch(corr: int, ts: float, kernel_ts: float, dur: float, *, name: str = "gemm",
            stream: int = 7, cat: str = "kernel") -> list[dict]:
    return [X("cuda_runtime", "cudaLaunchKernel", ts, 1.0, correlation=corr),
            X(cat, name, kernel_ts, dur, pid=0, tid=stream, stream=stream, correlation=corr)]


def test_union_across_streams_and_kernel_types(write_trace) -> None:
    ev = [
        *_launch(1, 0, 100, 50),                                      # compute 100-150
        *_launch(2, 1, 120, 60, stream=9),                            # compute 120-180 (overlap)
        *_launch(3, 2, 200, 30, name="ncclKernel_AllReduce_RING", stream=11),  # comm 200-230
        *_launch(4, 3, 210, 10, name="Memcpy DtoH (Device -> Pinned)", cat="gpu_memcpy"),
        *_launch(5, 4, 300, 20),                                      # compute 300-320
    ]
    con = con_over(read_trace(write_trace(ev)))
    (g,) = gpu_time_breakdown(con)
    assert g == {"rank": 0, "total_us": 220.0, "idle_us": 220.0 - 80 - 30 - 20,
                 "compute_us": 100.0, "non_compute_us": 30.0}
    kb = {r["type"]: (r["total_us"], r["count"]) for r in kernel_breakdown(con)}
    assert kb == {"computation": (100.0, 3), "communication": (30.0, 1), "memory": (10.0, 1)}


def test_activity_launched_after_the_last_profiler_step_is_left_out(write_trace) -> None:
    steps = [X("user_annotation", "ProfilerStep#1", 0, 100),
             X("user_annotation", "ProfilerStep#2", 100, 100)]
    ev = [*steps, *_launch(1, 10, 20, 30), *_launch(2, 150, 160, 20),
          *_launch(3, 250, 260, 500),                      # launched after step 2 ended
          X("kernel", "orphan", 900, 5, pid=0, tid=7, stream=7, correlation=99)]  # no launch
    (g,) = gpu_time_breakdown(con_over(read_trace(write_trace(ev))))
    assert g["total_us"] == 160.0 and g["compute_us"] == 50.0
    by_step = gpu_time_by_step(con_over(read_trace(write_trace(ev))))
    assert [(s["step"], s["total_us"], s["idle_us"]) for s in by_step] == [
        (1, 30.0, 0.0), (2, 20.0, 0.0)]
    # With a single ProfilerStep nothing is filtered (HTA: not enough iterations to cut).
    (g1,) = gpu_time_breakdown(con_over(read_trace(write_trace([steps[0], *ev[2:]]))))
    assert g1["total_us"] == 905.0 - 20.0


def test_traces_of_one_rank_are_measured_separately_and_summed(write_trace) -> None:
    a = read_trace(write_trace(_launch(1, 0, 10, 10), name="a.json"))
    b = read_trace(write_trace(_launch(1, 0, 1_000_000, 30), name="b.json"))
    (g,) = gpu_time_breakdown(con_over(a, b))
    # the gap between the two profiling windows is not idle time
    assert g == {"rank": 0, "total_us": 40.0, "idle_us": 0.0, "compute_us": 40.0,
                 "non_compute_us": 0.0}
    c = read_trace(write_trace(_launch(1, 0, 10, 10), name="c.json"), rank=1)
    assert [r["rank"] for r in gpu_time_breakdown(con_over(a, c))] == [0, 1]


def test_no_gpu_events_or_no_view_gives_empty_lists() -> None:
    con = con_over(table_of(CPU_ONLY))
    assert gpu_time_breakdown(con) == [] and kernel_breakdown(con) == []
    assert gpu_time_by_step(con) == []
    bare = duckdb.connect()
    assert gpu_time_breakdown(bare) == [] and kernel_breakdown(bare) == []


@pytest.mark.skipif(importlib.util.find_spec("hta") is None,
                    reason="HolisticTraceAnalysis not installed (see make_hta_reference.py)")
@pytest.mark.parametrize("path", GPU_TRACES[1:2] + GPU_TRACES[3:], ids=lambda p: p.name)
def test_live_hta_agrees(path: Path, tmp_path: Path) -> None:  # pragma: no cover - optional
    from hta.trace_analysis import TraceAnalysis

    shutil.copy(path, tmp_path)
    ta = TraceAnalysis(trace_dir=str(tmp_path), include_last_profiler_step=True)
    ref = ta.get_temporal_breakdown(visualize=False).iloc[0]
    ours = gpu_time_breakdown(con_over(read_trace(path)))[0]
    total = float(ref["kernel_time(us)"])
    for ours_key, hta_key in (("total_us", "kernel_time(us)"), ("idle_us", "idle_time(us)"),
                              ("compute_us", "compute_time(us)"),
                              ("non_compute_us", "non_compute_time(us)")):
        assert abs(ours[ours_key] - float(ref[hta_key])) <= 0.01 * total
