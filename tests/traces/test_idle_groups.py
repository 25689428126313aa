"""Many-rank summaries name the streams that are idler than on the other ranks, grouped by
ranks and cause, instead of one row per rank × stream; a healthy job gets no such line."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tracealyze.analyzer.diagnosis.summary import build_summary, render_text
from tracealyze.analyzer.gpu.idle_groups import unusual_streams
from tracealyze.analyzer.ingest.importer import import_traces


def _rank_trace(rank: int, *, late_host: bool, seed: int) -> dict:
    """A step loop: the compute stream (7) runs 300 kernels of 40-80 us, queued ahead by the
    host; an NCCL kernel on stream 20 every 25. ``late_host``: every 5th launch comes 300 us
    after the stream went idle (a host-bound rank)."""
    rng = random.Random(seed)
    ev, host, free = [], 1_000.0, {7: 0.0, 20: 0.0}
    for i in range(300):
        corr = 1000 + i
        nccl = i % 25 == 0
        stream = 20 if nccl else 7
        if late_host and i % 5 == 0:
            host = max(host, free[stream] + 300)
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                   "tid": 1, "ts": host, "dur": 4, "args": {"correlation": corr}})
        start = max(host + 10 + rng.uniform(0, 5), free[stream] + rng.uniform(1, 6))
        dur = rng.uniform(40, 80)
        ev.append({"ph": "X", "cat": "kernel",
                   "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL" if nccl else "sgemm",
                   "pid": 0, "tid": stream, "ts": start, "dur": dur,
                   "args": {"stream": stream, "correlation": corr, "device": 0}})
        free[stream] = start + dur
        host += rng.uniform(20, 40)
    return {"distributedInfo": {"rank": rank, "world_size": 64}, "traceEvents": ev}


def _job(tmp: Path, bad: range) -> Path:
    src = tmp / "traces"
    src.mkdir()
    for r in range(64):
        (src / f"rank{r}.json").write_text(json.dumps(_rank_trace(r, late_host=r in bad,
                                                                   seed=r)))
    run = tmp / "run"
    import_traces([src], run, jobs=1)
    return run


def test_a_group_of_host_bound_ranks_is_one_line_naming_the_cause(tmp_path: Path) -> None:
    run = _job(tmp_path, range(16, 24))
    summary = build_summary(run)
    groups = unusual_streams(summary["gpu_time"])
    # both streams these ranks feed wait on their host: one line
    assert [(g["streams"], g["ranks"], g["cause"]) for g in groups] == [
        ([7, 20], list(range(16, 24)), "host wait")]
    text = render_text(summary)
    assert "streams 7, 20 on ranks 16–23:" in text and "mostly host wait" in text
    assert text.count("\n  stream") == 1  # not one row per rank × stream


def test_a_healthy_job_has_no_unusual_stream(tmp_path: Path) -> None:
    run = _job(tmp_path, range(0))
    summary = build_summary(run)
    assert unusual_streams(summary["gpu_time"]) == []
    assert "idler than on the other ranks" not in render_text(summary)


def _rows(shares: dict[int, float], *, cause: str = "host_wait_us") -> list[dict]:
    return [{"rank": r, "total_us": 1000.0,
             "idle_breakdown": [{"stream": 7, "host_wait_us": 0.0, "kernel_wait_us": 0.0,
                                 "other_us": 0.0, cause: 1000.0 * x}]}
            for r, x in shares.items()]


def test_less_idle_than_the_peers_or_too_few_peers_is_no_finding() -> None:
    assert unusual_streams(_rows({0: 0.30, 1: 0.30, 2: 0.30, 3: 0.30, 4: 0.01})) == []
    assert unusual_streams(_rows({0: 0.10, 1: 0.10, 2: 0.90})) == []  # 3 ranks: no peers


def test_the_cause_is_the_kind_of_idle_time_that_rose() -> None:
    rows = _rows({r: 0.10 for r in range(8)}, cause="kernel_wait_us")
    rows[5]["idle_breakdown"][0]["other_us"] = 400.0  # rank 5 waits on another stream
    (g,) = unusual_streams(rows)
    assert g["ranks"] == [5] and g["cause"] == "other"
    assert abs(g["share"] - 0.50) < 1e-9 and abs(g["peer_share"] - 0.10) < 1e-9
