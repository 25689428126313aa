"""HTA's per-rank analyses (idle-time breakdown, comm/comp overlap, kernel launch stats)
against Holistic Trace Analysis 0.5 on the shipped traces, and on hand-built traces whose
answers are known."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from trace_helpers import CPU_ONLY, DATA, GPU_TRACES, ROCM, SAMPLED, X, con_over, table_of
from tracealyze.analyzer.gpu.idle import idle_breakdown
from tracealyze.analyzer.gpu.launch import launch_stats
from tracealyze.analyzer.gpu.overlap import comm_comp_overlap
from tracealyze.analyzer.gpu.summary import gpu_time_rows
from tracealyze.analyzer.ingest.read import read_trace

_IDS = {"ids": lambda p: p.name}
_LAUNCH = ("kernels", "short_kernels", "runtime_outliers", "launch_delay_outliers")


def _ours(path: Path) -> dict:
    con = con_over(table_of(path))
    return {
        "idle": {f"{r['rank']}/{r['stream']}": r for r in idle_breakdown(con)},
        "overlap": {str(r["rank"]): r["comm_comp_overlap_pct"] for r in comm_comp_overlap(con)},
        "launch": {str(r["rank"]): r for r in launch_stats(con)},
    }


def _check(ours: dict, ref: dict, path: Path) -> None:
    # idle: every stream and category within 1% of the stream's idle time
    assert set(ours["idle"]) == set(ref["idle_breakdown"])
    for key, cats in ref["idle_breakdown"].items():
        total = sum(cats.values())
        for cat in ("host_wait_us", "kernel_wait_us", "other_us"):
            assert ours["idle"][key][cat] == pytest.approx(cats.get(cat, 0.0),
                                                           abs=0.01 * total + 1e-6), (key, cat)
    # overlap: a percentage within 1% of HTA's; None where HTA has NaN (no communication)
    for rank, pct in ref["comm_comp_overlap_pct"].items():
        if pct is None:
            assert rank not in ours["overlap"]
        else:
            assert ours["overlap"][rank] == pytest.approx(pct, rel=0.01)
    for rank, counts in ref["launch"].items():
        if path == ROCM:  # HTA knows only the CUDA launch calls (see the next test)
            continue
        for k in _LAUNCH:
            assert ours["launch"][rank][k] == pytest.approx(counts[k], rel=0.01, abs=0), k


@pytest.mark.parametrize("path", GPU_TRACES, **_IDS)
def test_agrees_with_hta_on_every_shipped_trace(path: Path, hta_reference) -> None:
    # HTA without its ns rounding (it rounds ns timestamps inwards to whole us, which on the
    # ns trace widens each of its ~6,000 gaps by up to 2 us); on us traces both modes agree.
    _check(_ours(path), hta_reference["hta_exact"][path.name], path)


@pytest.mark.parametrize("path", [p for p in GPU_TRACES if "_ns" not in p.name], **_IDS)
def test_agrees_with_hta_as_shipped_on_us_traces(path: Path, hta_reference) -> None:
    _check(_ours(path), hta_reference["hta"][path.name], path)


def test_rocm_launches_are_counted_where_hta_sees_none(hta_reference) -> None:
    assert hta_reference["hta_exact"][ROCM.name]["launch"]["0"]["kernels"] == 0
    con = con_over(table_of(ROCM))
    (n_gpu,) = con.execute("SELECT count(*) FROM trace_events WHERE cat IN "
                           "('kernel', 'gpu_memcpy', 'gpu_memset')").fetchone()
    (ours,) = launch_stats(con)
    # every kernel here is started by hipLaunchKernel / hipExtModuleLaunchKernel; the two
    # copies by hipMemcpyWithStream, a synchronous call that is not a launch
    assert ours["kernels"] == n_gpu - 2 == 14


def _launch(corr: int, ts: float, dur: float, kernel_ts: float, kdur: float, *,
            name: str = "gemm", stream: int = 7, call: str = "cudaLaunchKernel") -> list[dict]:
    return [X("cuda_runtime", call, ts, dur, correlation=corr),
            X("kernel", name, kernel_ts, kdur, pid=0, tid=stream, stream=stream,
              correlation=corr)]


def test_idle_gaps_are_host_wait_kernel_wait_or_other(write_trace) -> None:
    ev = [
        *_launch(1, 0, 5, 10, 100),      # 10-110
        *_launch(2, 20, 5, 115, 10),     # gap 5 (< 30 us, launched before 110): kernel wait
        *_launch(3, 30, 5, 200, 10),     # gap 75, launched early: other (e.g. an event wait)
        *_launch(4, 250, 5, 260, 10),    # launched at 250 after the stream went idle at 210
        *_launch(5, 251, 5, 265, 10, stream=9),  # another stream's first event: no gap
    ]
    rows = idle_breakdown(con_over(read_trace(write_trace(ev))))
    assert rows == [
        {"rank": 0, "stream": 7, "host_wait_us": 50.0, "kernel_wait_us": 5.0, "other_us": 75.0},
        {"rank": 0, "stream": 9, "host_wait_us": 0.0, "kernel_wait_us": 0.0, "other_us": 0.0},
    ]
    # As HTA: the gap is to the end of the event just before in start order, so a kernel
    # inside a longer one (clock skew) makes a negative gap, and the next gap is measured
    # from the nested kernel's end: 10-110, then 20-30 (-90), then 120-125 (90: other)
    nested = [*ev[:2], *_launch(6, 1, 1, 20, 10), *_launch(7, 2, 1, 120, 5)]
    (row,) = idle_breakdown(con_over(read_trace(write_trace(nested, name="n.json"))))
    assert (row["host_wait_us"], row["kernel_wait_us"], row["other_us"]) == (0.0, -90.0, 90.0)


def test_overlap_is_shared_time_over_communication_time(write_trace) -> None:
    ev = [
        *_launch(1, 0, 1, 100, 100, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL", stream=11),
        *_launch(2, 1, 1, 50, 100),                  # compute 50-150: overlaps 100-150
        *_launch(3, 2, 1, 140, 30, stream=9),        # compute 140-170, unioned with the first
        *_launch(4, 3, 1, 300, 50, name="ncclKernel_Broadcast_RING", stream=11),  # alone
    ]
    (row,) = comm_comp_overlap(con_over(read_trace(write_trace(ev))))
    assert row == {"rank": 0, "comm_us": 150.0, "overlap_us": 70.0,
                   "comm_comp_overlap_pct": round(100 * 70 / 150, 2)}


def test_launch_stats_count_short_kernels_and_outliers(write_trace) -> None:
    ev = [
        *_launch(1, 0, 10, 20, 4),                   # short (4 < 10), delay 10
        *_launch(2, 30, 60, 100, 5),                 # runtime outlier (60 > 50): not "short"
        *_launch(3, 200, 5, 400, 50),                # delay 195 > 100
        *_launch(4, 500, 5, 505, 50, call="cudaMemsetAsync"),  # delay 0 (clipped)
        X("cuda_runtime", "cudaStreamSynchronize", 600, 5, correlation=9),  # not a launch
    ]
    (row,) = launch_stats(con_over(read_trace(write_trace(ev))))
    assert {k: row[k] for k in _LAUNCH} == {"kernels": 4, "short_kernels": 1,
                                            "runtime_outliers": 1, "launch_delay_outliers": 1}
    assert row["launch_delay_p50_us"] == pytest.approx(10.0)  # median of 10, 10, 195, 0
    assert row["launch_delay_p99_us"] > 150


def test_summary_rows_carry_every_analysis_per_rank_and_step() -> None:
    (row,) = gpu_time_rows(con_over(table_of(SAMPLED)))
    assert row["comm_comp_overlap_pct"] == pytest.approx(14.95, abs=0.01)
    assert {s["stream"] for s in row["idle_breakdown"]} == {7, 23, 25, 84, 203}
    assert row["launch"]["kernels"] == 1204
    assert [s["step"] for s in row["steps"]] == [551, 552]
    for s in row["steps"]:
        assert s["total_us"] == pytest.approx(s["idle_us"] + s["compute_us"]
                                              + s["non_compute_us"], abs=0.01)
        assert 0 < s["comm_comp_overlap_pct"] < 100 and s["idle_breakdown"]
    # per-step launches add up to the rank's (every launch here is inside a step)
    assert sum(s["launch"]["kernels"] for s in row["steps"]) == row["launch"]["kernels"]
    assert gpu_time_rows(con_over(table_of(CPU_ONLY))) == []


def test_every_rank_is_analysed_not_only_rank_0(write_trace) -> None:
    a = read_trace(write_trace(_launch(1, 0, 5, 10, 10), name="a.json"), rank=0)
    b = read_trace(write_trace([*_launch(1, 0, 5, 10, 10), *_launch(2, 100, 5, 120, 10)],
                               name="b.json"), rank=5)
    rows = gpu_time_rows(con_over(a, b))
    assert [r["rank"] for r in rows] == [0, 5]
    assert rows[1]["launch"]["kernels"] == 2 and rows[1]["idle_breakdown"][0]["host_wait_us"] > 0


@pytest.mark.skipif(importlib.util.find_spec("hta") is None,
                    reason="HolisticTraceAnalysis not installed (the hta extra has it)")
def test_live_hta_agrees_on_every_analysis() -> None:  # pragma: no cover - optional
    # HTA reads its ns-rounding switch at import: run it in a child, exact mode
    proc = subprocess.run(
        [sys.executable, str(DATA / "make_hta_reference.py"), "--child"],
        env={**os.environ, "HTA_DISABLE_NS_ROUNDING": "1"}, capture_output=True, text=True,
        timeout=600, check=True)
    live = json.loads(proc.stdout.strip().splitlines()[-1])
    for path in GPU_TRACES:
        _check(_ours(path), live[path.name], path)
