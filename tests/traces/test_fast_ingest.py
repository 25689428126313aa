"""The fast ingest path (DuckDB's JSON reader over the copied events array) gives exactly the
rows of the Python path, on the shipped traces, on generated Kineto jobs and on events
written the odd ways real traces write them; what it cannot read goes to the Python path."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from kineto_gen import rank_trace
from trace_helpers import CPU_ONLY, GPU_TRACES
from tracealyze.analyzer.ingest import stream


def _both(path: Path, tmp: Path, monkeypatch) -> tuple:
    """(fast rows, Python rows, fast info, whether the fast path ran)."""
    ran = []
    real = stream._fast

    def spy(*a, **k):
        out = real(*a, **k)
        ran.append(True)
        return out

    monkeypatch.setattr(stream, "FAST_MIN_BYTES", 0)
    monkeypatch.setattr(stream, "_fast", spy)
    fast = stream.ingest(path, tmp / "fast.parquet")
    monkeypatch.setattr(stream, "FAST_MIN_BYTES", 1 << 62)
    slow = stream.ingest(path, tmp / "slow.parquet")
    assert (fast.trace_id, fast.rank, fast.events) == (slow.trace_id, slow.rank, slow.events)
    return (pq.read_table(tmp / "fast.parquet"), pq.read_table(tmp / "slow.parquet"),
            fast, bool(ran))


@pytest.mark.parametrize("path", [*GPU_TRACES, CPU_ONLY], ids=lambda p: p.name)
def test_same_rows_as_the_python_path_on_every_shipped_trace(path: Path, tmp_path: Path,
                                                            monkeypatch) -> None:
    fast, slow, _, ran = _both(path, tmp_path, monkeypatch)
    assert ran
    assert fast.equals(slow)


@settings(max_examples=25, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(trace=rank_trace(0, 1, n_windows=3, ns=True))
def test_same_rows_on_generated_traces(trace: dict, tmp_path: Path, monkeypatch) -> None:
    p = tmp_path / "t.json"
    p.write_text(json.dumps(trace))
    fast, slow, _, ran = _both(p, tmp_path, monkeypatch)
    assert ran and fast.equals(slow)


def _odd_events() -> list[dict]:
    long_args = {"Input Dims": [[4096] * 40] * 20, "Sequence number": 7, "Fwd thread id": 1}
    return [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": "1234", "tid": "0x10",
         "ts": 100, "dur": 5, "args": {"External id": "77", "Ev Idx": 3, "note": "ünï"}},
        {"ph": "X", "cat": "Kernel", "name": "gemm", "pid": 0, "tid": 7.0, "ts": 101.5,
         "dur": 2.25, "args": {"stream": 7, "correlation": 5.0, "device": 0, "grid": [1, 2]}},
        {"ph": "X", "cat": "cuda_sync", "name": "Context Sync", "pid": 0, "tid": 7, "ts": 103,
         "dur": 1, "args": {"stream": 4294967295, "correlation": 6}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 99, "args": {"correlation": 5, "stream": "0x0"}},  # no dur
        {"ph": "X", "cat": "cpu_op", "name": "big", "pid": 1, "tid": 1, "ts": 98, "dur": 1,
         "args": long_args},  # over 2 KB: scalars only
        {"ph": "X", "cat": "cpu_op", "name": "listargs", "pid": 1, "tid": 1, "ts": 97,
         "dur": 1, "args": [1, 2]},  # not an object: no args
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
         "ts": 102, "s": "t", "args": {"Bytes": 512, "Device Type": 1}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "other instant", "pid": 1, "tid": 1,
         "ts": 102},
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
         "tid": "PyTorch Profiler", "ts": 90, "dur": 50},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 1, "tid": 1,
         "ts": 95, "dur": 20},
        {"ph": "X", "cat": "cpu_op", "name": None, "pid": None, "tid": 1, "ts": 96, "dur": 0},
    ]


@pytest.mark.parametrize("gz", [False, True])
def test_same_rows_on_events_written_the_odd_ways(tmp_path: Path, monkeypatch,
                                                 gz: bool) -> None:
    doc = json.dumps({"schemaVersion": 1, "traceEvents": _odd_events(),
                      "distributedInfo": {"rank": 3}}, indent=2).encode()
    p = tmp_path / ("t.json.gz" if gz else "t.json")
    p.write_bytes(gzip.compress(doc) if gz else doc)
    fast, slow, info, ran = _both(p, tmp_path, monkeypatch)
    assert ran and fast.equals(slow)
    assert info.rank == 3 and fast.num_rows == 9  # X events but Trace, and the [memory] one
    rows = {r["name"]: r for r in fast.to_pylist()}
    assert rows["aten::mm"]["pid"] == 1234 and rows["aten::mm"]["tid"] == 16
    assert rows["gemm"]["cat"] == "kernel" and rows["gemm"]["correlation"] == 5
    assert rows["Context Sync"]["stream"] is None
    big = json.loads(rows["big"]["args"])
    assert big == {"Sequence number": 7, "Fwd thread id": 1}


@pytest.mark.parametrize("trace", [
    b'{"traceEvents": [{"ph": "X", "cat": "c", "name": "n", "ts": "soon", "dur": 1}]}',
    b'{"traceEvents": [{"ph": "X", "cat": "c", "name": "n", "ts": 1, "dur": 1}, ]}',
    b'{"other": 1, "traceEvents": [' + b'[' * 5000 + b']' * 5000 + b']}',
], ids=["text-timestamp", "trailing-comma", "deep"])
def test_what_duckdb_cannot_read_goes_to_the_python_path(trace: bytes, tmp_path: Path,
                                                        monkeypatch) -> None:
    p = tmp_path / "t.json"
    p.write_bytes(trace)
    monkeypatch.setattr(stream, "FAST_MIN_BYTES", 0)
    try:
        fast = stream.ingest(p, tmp_path / "a.parquet")
    except Exception as e:  # the Python path's own verdict, as before
        fast = e
    monkeypatch.setattr(stream, "FAST_MIN_BYTES", 1 << 62)
    try:
        slow = stream.ingest(p, tmp_path / "b.parquet")
    except Exception as e:
        slow = e
    if isinstance(slow, Exception):
        assert type(fast) is type(slow) and str(fast) == str(slow)
    else:
        assert pq.read_table(tmp_path / "a.parquet").equals(pq.read_table(tmp_path / "b.parquet"))


def test_json_size_of_a_gzip_trace_comes_from_its_trailer(tmp_path: Path) -> None:
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(b"x" * 123_456))
    assert stream.json_bytes(p) == 123_456
    q = tmp_path / "t.json"
    q.write_bytes(b"y" * 77)
    assert stream.json_bytes(q) == 77
