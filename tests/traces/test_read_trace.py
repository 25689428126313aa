"""read_trace on the real Kineto traces and on the malformed inputs users will hand us."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pytest
from trace_helpers import ALEXNET, CPU_ONLY, DATA, NCCL_NS, ROCM, SAMPLED, X, con_over, table_of
from tracealyze.analyzer.errors import TraceError
from tracealyze.analyzer.ingest.read import (
    ARGS_MAX_BYTES,
    TRACE_EVENTS_SCHEMA,
    read_trace,
    trace_id_for,
)

FORMAT_COLUMNS = [
    "trace_id", "step", "cat", "name", "ts_us", "dur_us", "pid", "tid", "stream",
    "correlation", "external_id", "device", "args",
]


def _raw_events(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


@pytest.mark.parametrize("path", [NCCL_NS, SAMPLED, ALEXNET, CPU_ONLY, ROCM], ids=lambda p: p.name)
def test_every_complete_event_is_kept_with_the_format_columns(path: Path) -> None:
    t = table_of(path)
    assert t.schema == TRACE_EVENTS_SCHEMA
    assert t.column_names == [*FORMAT_COLUMNS, "rank"]
    raw = _raw_events(path)
    # 'X' events except the profiler's own whole-trace span; M/s/f/i are not events.
    want = sum(1 for e in raw if e.get("ph") == "X" and e.get("cat") != "Trace")
    assert t.num_rows == want
    assert t.column("trace_id").null_count == 0 and len(t.column("trace_id").unique()) == 1
    ts = t.column("ts_us").to_pylist()
    assert ts == sorted(ts)  # written in time order


def test_ns_resolution_timestamps_are_microseconds_with_fractions() -> None:
    # displayTimeUnit 'ns' only labels the viewer's axis; ts stays in us (epoch ~1.7e15).
    t = table_of(NCCL_NS)
    con = con_over(t)
    lo, hi, frac = con.execute(
        "SELECT min(ts_us), max(ts_us + dur_us), count(*) FILTER (WHERE dur_us <> floor(dur_us))"
        " FROM trace_events").fetchone()
    assert 1.7e15 < lo < 1.72e15
    assert 0.4e6 < hi - lo < 0.7e6  # ~495 ms of events, not 495 s or 0.495 ms
    assert frac > 10_000  # sub-microsecond durations survive


def test_steps_from_profiler_step_spans_and_correlation() -> None:
    con = con_over(table_of(NCCL_NS))
    steps = [r[0] for r in con.execute(
        "SELECT DISTINCT step FROM trace_events WHERE step IS NOT NULL ORDER BY 1").fetchall()]
    assert steps == [101, 102, 103, 104, 105]
    # Every kernel gets the step of the runtime call that launched it ...
    missing, mismatched = con.execute("""
        SELECT count(*) FILTER (WHERE k.step IS NULL),
               count(*) FILTER (WHERE k.step <> r.step)
        FROM trace_events k JOIN trace_events r
          ON r.correlation = k.correlation AND r.cat = 'cuda_runtime'
        WHERE k.cat = 'kernel'""").fetchone()
    assert (missing, mismatched) == (0, 0)
    # ... and host events get the step whose span contains them, whatever thread they run on.
    bad = con.execute("""
        SELECT count(*) FROM trace_events e JOIN trace_events p
          ON p.name = 'ProfilerStep#' || e.step
        WHERE e.cat = 'cpu_op' AND NOT (e.ts_us >= p.ts_us AND e.ts_us <= p.ts_us + p.dur_us)
    """).fetchone()[0]
    assert bad == 0
    assert con.execute("SELECT count(DISTINCT tid) FROM trace_events WHERE cat = 'cpu_op' "
                       "AND step IS NOT NULL").fetchone()[0] >= 2


def test_trace_without_profiler_step_has_null_steps_and_cuda_sync_events() -> None:
    con = con_over(table_of(ALEXNET))
    assert con.execute("SELECT count(step) FROM trace_events").fetchone()[0] == 0
    rows = dict(con.execute("SELECT name, max(stream) FROM trace_events WHERE cat = 'cuda_sync' "
                            "GROUP BY name").fetchall())
    assert rows["Stream Sync"] == 7
    # Kineto writes 'no stream' as uint32(-1): stored as null, not 4294967295.
    assert rows["Context Sync"] is None


def test_rank_from_distributed_info_else_argument_else_zero(write_trace) -> None:
    assert set(table_of(CPU_ONLY).column("rank").to_pylist()) == {34}
    assert set(read_trace(CPU_ONLY, rank=3).column("rank").to_pylist()) == {3}
    p = write_trace([X("cpu_op", "aten::add", 1.0, 2.0)])
    assert read_trace(p).column("rank").to_pylist() == [0]


def test_cpu_only_trace_has_no_device_rows() -> None:
    con = con_over(table_of(CPU_ONLY))
    assert con.execute("SELECT count(*) FROM trace_events WHERE cat IN "
                       "('kernel', 'gpu_memcpy', 'gpu_memset') OR stream IS NOT NULL"
                       ).fetchone()[0] == 0
    assert con.execute("SELECT count(*) FROM trace_events WHERE name = 'ProfilerStep#551' "
                       "AND step = 551").fetchone()[0] == 1


def test_rocm_trace_hex_streams_and_device() -> None:
    con = con_over(table_of(ROCM))
    # hipMemcpyWithStream's args.stream is the API argument '0x0': kept in args, not a
    # device stream.
    rt = con.execute("SELECT stream, args FROM trace_events WHERE name = 'hipMemcpyWithStream'"
                     ).fetchall()
    assert rt and all(s is None and json.loads(a)["stream"] == "0x0" for s, a in rt)
    dev = con.execute("SELECT DISTINCT stream, device FROM trace_events "
                      "WHERE cat IN ('kernel', 'gpu_memcpy')").fetchall()
    assert dev == [(0, 2)]
    assert con.execute("SELECT count(*) FROM trace_events WHERE cat = 'kernel' "
                       "AND step = 1").fetchone()[0] == 14


def test_args_are_the_events_own_args_compact_and_agree_with_the_promoted_columns() -> None:
    t = table_of(SAMPLED)
    kernels = 0
    for row in t.to_pylist():
        if row["args"] is None:
            continue
        text = row["args"]
        obj = json.loads(text)
        assert len(text) <= ARGS_MAX_BYTES and "\n" not in text and ", " not in text
        if row["cat"] == "kernel":  # the promoted values are columns, and stay in args
            kernels += 1
            assert (obj["correlation"], obj["External id"], obj["device"], obj["stream"]) \
                == (row["correlation"], row["external_id"], row["device"], row["stream"])
    assert kernels > 100
    con = con_over(t)
    assert con.execute("SELECT count(*) FROM trace_events WHERE cat = 'kernel' AND "
                       "(correlation IS NULL OR external_id IS NULL OR device IS NULL)"
                       ).fetchone()[0] == 0


def test_big_args_keep_only_scalars(write_trace) -> None:
    big = X("cpu_op", "aten::cat", 1.0, 2.0, **{"Input Dims": [[1, 2, 3]] * 1000,
                                             "Sequence number": 7})
    t = read_trace(write_trace([big]))
    assert json.loads(t.column("args")[0].as_py()) == {"Sequence number": 7}


def test_trace_id_is_stable_and_cheap_to_recompute(tmp_path: Path) -> None:
    # The trace's own id when it has one, else file name + content hash.
    assert table_of(NCCL_NS).column("trace_id")[0].as_py() == "094DFF9CD7781F8ADDEAFBA6A8855CA7"
    tid = table_of(SAMPLED).column("trace_id")[0].as_py()
    assert tid.startswith("gpu_sampled_rank0-")
    assert read_trace(SAMPLED).column("trace_id")[0].as_py() == tid
    for p in (NCCL_NS, SAMPLED, ROCM):
        assert trace_id_for(p) == table_of(p).column("trace_id")[0].as_py()
    # the same content decompressed keeps its id
    plain = tmp_path / "gpu_sampled_rank0.json"
    plain.write_bytes(gzip.decompress(SAMPLED.read_bytes()))
    assert trace_id_for(plain) == tid


def test_legacy_categories_json_array_form_and_odd_events(tmp_path: Path) -> None:
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
        X("Operator", "aten::mm", 10.0, 5.0),
        X("Runtime", "cudaLaunchKernel", 11.0, 1.0, correlation=9),
        {**X("Kernel", "sgemm", 12.0, 3.0, pid=0, tid="stream 7"), "args": {
            "stream": "7", "correlation": 9}},
        {"ph": "s", "id": 9, "pid": 1, "tid": 1, "ts": 11.0, "cat": "ac2g", "name": "ac2g"},
        {"ph": "C", "name": "mem", "pid": 1, "ts": 12.0, "args": {"bytes": 5}},
        {"ph": "X", "cat": "cpu_op", "name": "no-ts", "pid": 1, "tid": 1},
        "not an event",
    ]
    p = tmp_path / "old.json"
    p.write_text(json.dumps(events))
    t = read_trace(p)
    assert t.column("cat").to_pylist() == ["cpu_op", "cuda_runtime", "kernel"]
    assert t.column("stream").to_pylist() == [None, None, 7]
    assert t.column("tid").to_pylist() == [1, 1, None]


def test_empty_event_list_gives_an_empty_table(write_trace) -> None:
    t = read_trace(write_trace([]))
    assert t.num_rows == 0 and t.schema == TRACE_EVENTS_SCHEMA


@pytest.mark.parametrize(
    "content, needle",
    [
        (gzip.compress(b'{"traceEvents": []}')[:-12], "truncated or corrupt gzip"),
        (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1', "not valid JSON"),
        (b'{"schemaVersion": 1, "events": []}', "no 'traceEvents'"),
        (b"", "empty"),
        (b"\x00\x01binary", "not valid JSON"),
    ],
    ids=["truncated-gz", "truncated-json", "not-a-trace", "empty", "binary"],
)
def test_malformed_files_raise_one_clear_trace_error(tmp_path: Path, content, needle) -> None:
    p = tmp_path / "bad.json.gz"
    p.write_bytes(content)
    with pytest.raises(TraceError) as e:
        read_trace(p)
    msg = str(e.value)
    assert needle in msg and str(p) in msg and "\n" not in msg


def test_truncated_real_trace_raises_trace_error(tmp_path: Path) -> None:
    p = tmp_path / "cut.pt.trace.json.gz"
    p.write_bytes(SAMPLED.read_bytes()[: 60_000])
    with pytest.raises(TraceError, match="truncated"):
        read_trace(p)


def test_missing_file_raises_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "nope.json")


def test_license_of_the_fixtures_is_kept() -> None:
    assert "MIT License" in (DATA / "LICENSE-HolisticTraceAnalysis.txt").read_text()
    assert isinstance(table_of(ROCM), pa.Table)
