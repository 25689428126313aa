"""The typed, column-at-a-time first pass (:mod:`.ingest.columnar`) gives the rows of the
reference path (one event at a time, :func:`.stream._convert`) on the shipped traces, on
generated Kineto jobs written compact or pretty-printed, and on events written the odd ways
real traces write them; a chunk it declines goes to the reference, and a trace neither
reads gets the reference's own verdict."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kineto_gen import rank_trace
from trace_helpers import CPU_ONLY, GPU_TRACES, assert_same_rows
from tracealyze.analyzer.ingest import columnar, stream

REAL_CONVERT = columnar.convert


def _both(path: Path, tmp: Path, monkeypatch) -> tuple:
    """(typed rows, reference rows, typed info, chunks the typed path converted)."""
    converted = []

    def spy(*a, **k):
        out = REAL_CONVERT(*a, **k)
        converted.append(out is not None)
        return out

    # (a context: hypothesis runs many examples on one function-scoped monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(columnar, "convert", spy)
        typed = stream.ingest(path, tmp / "typed.parquet")
        m.setattr(columnar, "convert", lambda *a, **k: None)  # every chunk declined
        ref = stream.ingest(path, tmp / "ref.parquet")
    assert (typed.trace_id, typed.rank, typed.events) == (ref.trace_id, ref.rank, ref.events)
    return (pq.read_table(tmp / "typed.parquet"), pq.read_table(tmp / "ref.parquet"), typed,
            converted)


@pytest.mark.parametrize("path", [*GPU_TRACES, CPU_ONLY], ids=lambda p: p.name)
def test_same_rows_as_the_reference_on_every_shipped_trace(path: Path, tmp_path: Path,
                                                          monkeypatch) -> None:
    typed, ref, _, converted = _both(path, tmp_path, monkeypatch)
    assert converted and all(converted)  # Kineto's own traces: nothing declined
    assert_same_rows(typed, ref)


@settings(max_examples=25, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(trace=rank_trace(0, 1, n_windows=3, ns=True), indent=st.sampled_from([None, 1, 4]))
def test_same_rows_on_generated_traces(trace: dict, indent: int | None, tmp_path: Path,
                                       monkeypatch) -> None:
    p = tmp_path / "t.json"
    p.write_text(json.dumps(trace, indent=indent))
    typed, ref, _, converted = _both(p, tmp_path, monkeypatch)
    assert all(converted)
    assert_same_rows(typed, ref)


# How Kineto itself writes events: pretty-printed, floats with trailing zeros, escapes.
KINETO_TEXT = b"""{
  "schemaVersion": 1,
  "traceEvents": [
  {
    "ph": "X", "cat": "kernel", "name": "void gemm<\\"a\\\\b\\">", "pid": 0, "tid": 7,
    "ts": 101.500, "dur": 2.250000,
    "args": {
      "External id": 12,
      "queued": 0, "device": 0, "context": 1,
      "stream": 7, "correlation": 5,
      "blocks per SM": 5.300000, "warps per SM": 21.200001,
      "grid": [4, 106, 1], "block": [128, 1, 1], "note": "\\u00e9t\\u00e9 \\ud83d\\ude00"
    }
  },
  {
    "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
    "ts": 99, "dur": 1,
    "args": {
      "External id": 12, "cbid": 211, "correlation": 5, "stream": 0
    }
  },
  {
    "ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 1, "tid": 1,
    "ts": 95, "dur": 20, "args": {}
  }
  ],
  "traceName": "t"
}"""


def test_kineto_spelling_is_kept_and_means_the_same(tmp_path: Path, monkeypatch) -> None:
    p = tmp_path / "k.json"
    p.write_bytes(KINETO_TEXT)
    typed, ref, _, converted = _both(p, tmp_path, monkeypatch)
    assert converted == [True]
    assert_same_rows(typed, ref)
    rows = {r["name"]: r for r in typed.to_pylist()}
    gemm = rows['void gemm<"a\\b">']
    assert (gemm["stream"], gemm["correlation"], gemm["external_id"], gemm["device"]) == \
        (7, 5, 12, 0)
    assert '"blocks per SM":5.300000' in gemm["args"]  # the trace's own spelling, compact
    assert json.loads(gemm["args"])["note"] == "été \U0001F600"
    launch = rows["cudaLaunchKernel"]
    assert launch["stream"] is None and json.loads(launch["args"])["stream"] == 0
    assert rows["ProfilerStep#4"]["args"] is None  # {}: no args
    assert gemm["step"] == launch["step"] == 4


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
        {"ph": "X", "cat": "cpu_op", "name": "huge pid", "pid": 2**70, "tid": True, "ts": 97,
         "dur": 1, "args": {"correlation": 2**70, "device": -1}},
    ]


@pytest.mark.parametrize("gz", [False, True])
def test_same_rows_on_events_written_the_odd_ways(tmp_path: Path, monkeypatch,
                                                 gz: bool) -> None:
    doc = json.dumps({"schemaVersion": 1, "traceEvents": _odd_events(),
                      "distributedInfo": {"rank": 3}}, indent=2).encode()
    p = tmp_path / ("t.json.gz" if gz else "t.json")
    p.write_bytes(gzip.compress(doc) if gz else doc)
    typed, ref, info, converted = _both(p, tmp_path, monkeypatch)
    assert converted == [True]  # all of it by column, the odd values included
    assert_same_rows(typed, ref)
    assert info.rank == 3 and typed.num_rows == 9  # X events but Trace, and [memory]
    rows = {r["name"]: r for r in typed.to_pylist()}
    assert rows["aten::mm"]["pid"] == 1234 and rows["aten::mm"]["tid"] == 16
    assert rows["aten::mm"]["external_id"] == 77
    assert rows["gemm"]["cat"] == "kernel" and rows["gemm"]["correlation"] == 5
    assert rows["Context Sync"]["stream"] is None
    assert rows["cudaLaunchKernel"]["dur_us"] == 0.0 and rows["cudaLaunchKernel"]["stream"] is None
    assert json.loads(rows["big"]["args"]) == {"Sequence number": 7, "Fwd thread id": 1}
    assert rows[""]["pid"] is None  # a null name and pid
    huge = rows["huge pid"]
    assert huge["pid"] is None and huge["tid"] is None and huge["correlation"] is None


@pytest.mark.parametrize("events", [
    [{"ph": "X", "cat": "c", "name": "n", "ts": "100", "dur": 1}],  # text timestamp
    [{"ph": "X", "cat": "c", "name": "n", "ts": None, "dur": 1}, {"ph": "X", "ts": 5}],
    [{"ph": "X", "cat": 5, "name": "n", "ts": 1, "dur": 1}],  # a category that is a number
    [{"ph": "X", "cat": "c", "name": "n", "ts": 1, "dur": 1, "args": [1, 2]}],
    [{"ph": "X", "cat": "c", "name": "n", "ts": 10**400 if False else 1e300, "dur": "2"}],
    [3, "x", {"ph": "X", "cat": "c", "name": "n", "ts": 1, "dur": 1}],  # not all objects
    [{"ph": "Xx", "cat": "c", "name": "n", "ts": 1}, {"cat": "c", "name": "n", "ts": 2}],
], ids=["text-ts", "null-ts", "numeric-cat", "list-args", "text-dur", "non-objects",
        "odd-phases"])
def test_what_the_typed_path_declines_gives_the_reference_rows(events: list, tmp_path: Path,
                                                              monkeypatch) -> None:
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events}))
    typed, ref, _, converted = _both(p, tmp_path, monkeypatch)
    assert converted in ([False], [])  # declined (or never typed: not all objects)
    assert typed.equals(ref)


@pytest.mark.parametrize("trace", [
    b'{"traceEvents": [{"ph": "X", "cat": "c", "name": "n", "ts": 1, "dur": 1}, ]}',
    b'{"traceEvents": [{"ph": "X", "cat": "c", "name": "n", "ts": 1, "dur": 1e999}]}',
    b'{"traceEvents": [{"ph": "X", "cat": "c", "name": "n", "ts": 1, "args": {"a": "\xff"}}]}',
    b'{"traceEvents": [{"ph": "X", "cat": "c", "name": "n\xff", "ts": 1}]}',
    b'{"traceEvents": [{"ph": "X", "cat": "c\xff", "name": "n", "ts": 1}]}',
    b'{"traceEvents": [{"ph": "X", "cat": "c", "name": "n", "ts": 1, "args": {"stream": "\xff"}}]}',
    b'{"traceEvents": [{"ph": "X", "ts": 1, "args": {"x": "\xff' + b"a" * 3000 + b'"}}]}',
    b'{"other": 1, "traceEvents": [' + b'[' * 5000 + b']' * 5000 + b']}',
], ids=["trailing-comma", "number-overflow", "not-utf8-args", "not-utf8-name", "not-utf8-cat",
        "not-utf8-promoted", "not-utf8-long-args", "deep"])
def test_a_trace_the_typed_path_cannot_read_gets_the_reference_verdict(
        trace: bytes, tmp_path: Path, monkeypatch) -> None:
    p = tmp_path / "t.json"
    p.write_bytes(trace)
    try:
        typed = stream.ingest(p, tmp_path / "a.parquet")
    except Exception as e:  # the reference's own verdict, as before
        typed = e
    monkeypatch.setattr(columnar, "convert", lambda *a, **k: None)
    try:
        ref = stream.ingest(p, tmp_path / "b.parquet")
    except Exception as e:
        ref = e
    if isinstance(ref, Exception):
        assert type(typed) is type(ref) and str(typed) == str(ref)
    else:
        assert_same_rows(pq.read_table(tmp_path / "a.parquet"),
                         pq.read_table(tmp_path / "b.parquet"))


@pytest.mark.parametrize("depth", [900, 200_000])
@pytest.mark.parametrize("where", ["args", "after"])
def test_deep_nesting_inside_an_event_is_read_or_refused_never_a_crash(
        depth: int, where: str, tmp_path: Path) -> None:
    """orjson (the chunk parser before issue 31) has no nesting limit on loads: 200,000
    brackets in one event's args overflowed the C stack and killed the process. In a
    subprocess, so that a crash fails the test instead of the run."""
    import subprocess
    import sys

    deep = b"[" * depth + b"]" * depth
    ev = b'{"ph": "X", "cat": "c", "name": "n", "ts": 1, "args": {"a": %s}}' % (
        deep if where == "args" else b"1")
    tail = b', "x": %s' % deep if where == "after" else b""
    p = tmp_path / "t.json"
    p.write_bytes(b'{"traceEvents": [%s, {"ph": "X", "ts": 2}]%s}' % (ev, tail))
    code = ("import sys; from pathlib import Path; "
            "from tracealyze.analyzer.ingest.stream import ingest; "
            "from tracealyze.analyzer.errors import TraceError\n"
            f"try:\n    print(ingest(Path({str(p)!r}), Path({str(tmp_path / 'o')!r})).events)\n"
            "except TraceError as e:\n    print(e)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-500:]
    if depth < 1000 and where == "args":
        assert res.stdout.strip() == "2"
    elif depth > 1024:
        assert "more than 1024 levels deep" in res.stdout


def test_same_rows_on_a_real_profile_of_a_transformer_with_every_option(
        tmp_path: Path, monkeypatch) -> None:
    """torch.profiler's own trace of a few GPT-2 training steps (a small config) with shapes,
    memory, stacks, FLOPs and modules recorded: Python-function events, allocator instants,
    module hierarchy and FLOP args that no generator of ours writes."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128,
                                  n_positions=32)
    model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 128, (2, 16))
    out = tmp_path / "gpt2.pt.trace.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
                 with_stack=True, with_flops=True, with_modules=True,
                 schedule=schedule(wait=0, warmup=1, active=2),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(out))) as prof:
        for _ in range(3):
            model(ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    trace = json.loads(out.read_text())
    cats = {e.get("cat") for e in trace["traceEvents"]}
    assert {"python_function", "cpu_instant_event", "cpu_op"} <= cats  # what makes it real
    typed, ref, info, converted = _both(out, tmp_path, monkeypatch)
    assert converted and all(converted)
    assert_same_rows(typed, ref)
    steps = set(typed["step"].to_pylist()) - {None}
    assert len(steps) == 2 and info.events == typed.num_rows > 1000
    memory = [a for n, a in zip(typed["name"].to_pylist(), typed["args"].to_pylist(),
                                strict=True) if n == "[memory]"]
    assert memory and all("Bytes" in json.loads(a) for a in memory)
