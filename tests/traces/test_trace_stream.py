"""Streaming ingest (issue 16): the same rows whether a trace fits one batch (numpy second
pass) or not (DuckDB second pass, spilling), decompression bombs refused with a clear message,
and nothing of a refused import left behind."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from click.testing import CliRunner
from trace_helpers import NCCL_NS, SAMPLED, assert_same_rows, table_of
from tracealyze.analyzer.cli import main
from tracealyze.analyzer.errors import TraceError
from tracealyze.analyzer.ingest import stream as trace_stream
from tracealyze.analyzer.ingest.read import read_trace, trace_id_for
from tracealyze.analyzer.ingest.stream import Limits


@pytest.mark.parametrize("trace", [SAMPLED, NCCL_NS], ids=["sampled", "nccl"])
def test_batched_duckdb_pass_gives_the_rows_of_the_in_memory_pass(trace: Path,
                                                                 monkeypatch) -> None:
    whole = table_of(trace)  # one batch: steps in numpy
    monkeypatch.setattr(trace_stream, "BATCH", 700)  # many batches ...
    monkeypatch.setattr(trace_stream, "IN_MEMORY", 1000)  # ... and steps in DuckDB
    streamed = read_trace(trace)
    assert streamed.num_rows == whole.num_rows > 4000
    assert streamed.equals(whole)
    assert streamed.column("step").null_count < streamed.num_rows  # steps were assigned
    assert trace_id_for(trace) == whole["trace_id"][0].as_py()


def test_a_decompression_bomb_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (40 << 20) + b"]}"))
    assert bomb.stat().st_size < (100 << 10)  # ~400x
    with pytest.raises(TraceError) as e:
        read_trace(bomb, limits=Limits(max_ratio=100, check_after=1 << 20))
    msg = str(e.value)
    assert "decompression bomb" in msg and str(bomb) in msg and "--max-ratio" in msg
    with pytest.raises(TraceError, match="decompresses to more than 1,000,000 bytes"):
        read_trace(bomb, limits=Limits(max_ratio=None, max_bytes=1_000_000))
    # without limits it is just an empty trace
    assert read_trace(bomb, limits=Limits(max_ratio=None)).num_rows == 0


def test_cli_refuses_a_bad_max_ratio_and_a_bad_trace_leaves_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    res = CliRunner().invoke(main, ["import-trace", str(SAMPLED), str(run),
                                    "--max-ratio", "-1"])
    assert res.exit_code == 2 and "--max-ratio" in res.output
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(SAMPLED.read_bytes()[:20_000])
    # (--quiet: whether the good trace's progress line comes first depends on which of the
    # two reading processes finishes first; the error itself is one line either way)
    res = CliRunner().invoke(main, ["import-trace", str(SAMPLED), str(cut), str(run),
                                    "--quiet"])
    assert res.exit_code == 2 and "cut.json.gz" in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert res.output.startswith("Error: ")
    assert not run.exists() and not list(tmp_path.glob(".tracealyze-import-*"))


def test_arrow_builders_match_pa_array_without_importing_pandas() -> None:
    import ast
    import subprocess
    import sys

    code = """
import sys
import pyarrow as pa
from tracealyze.analyzer.ingest.arrow_build import floats, ints, repeated, strings, values
cases = [[1, None, 3], [], [None], [2**70, 5, None], [-(2**63), 2**63 - 1]]
out = [ints(c).to_pylist() for c in cases]
s = strings(["a", None, "é", "\\ud800"]).to_pylist()
f = floats([1.5, -0.0]).to_pylist()
r = repeated("t", 3).to_pylist()
v = [int(x) for x in values(ints([4, 5, 6]).slice(1))]
print(repr((out, s, f, r, v, "pandas" in sys.modules)))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    out, s, f, r, v, pandas = ast.literal_eval(res.stdout.strip())
    assert out == [[1, None, 3], [], [None], [None, 5, None], [-(2**63), 2**63 - 1]]
    assert s == ["a", None, "é", "?"]  # a lone surrogate is not UTF-8: replaced
    assert f == [1.5, -0.0] and r == ["t", "t", "t"] and v == [5, 6]
    assert not pandas


def _no_fast_path(monkeypatch) -> None:
    from tracealyze.analyzer.ingest import chunks as trace_chunks

    def refuse(*_a, **_k):
        raise trace_chunks.Fallback("test")
        yield  # (a generator, like the real one)

    monkeypatch.setattr(trace_stream, "chunked_events", refuse)


@pytest.mark.parametrize("trace", sorted((Path(__file__).parents[1] / "data" / "traces")
                                         .glob("*.json.gz")), ids=lambda p: p.name[:12])
def test_the_orjson_chunks_give_the_rows_of_the_incremental_parser(trace: Path,
                                                                   monkeypatch) -> None:
    fast = read_trace(trace)
    _no_fast_path(monkeypatch)
    assert_same_rows(read_trace(trace), fast)


def test_cuts_inside_strings_and_nested_objects_fall_back_or_parse_right(tmp_path: Path,
                                                                         monkeypatch) -> None:
    import json

    tricky = [{"ph": "X", "cat": "cpu_op", "name": 'a"}, {"b', "ts": float(i), "dur": 1.0,
               "pid": 1, "tid": 1, "args": {"nested": [{"x": 1}, {"y": "}, {"}],
                                            "External id": i}} for i in range(3000)]
    p = tmp_path / "tricky.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": tricky,
                             "deviceProperties": [{"id": 0}], "traceName": "t"}))
    monkeypatch.setattr(trace_stream, "READ_SIZE", 4096)
    from tracealyze.analyzer.ingest import chunks as trace_chunks

    monkeypatch.setattr(trace_chunks, "CHUNK", 8192)  # many cuts, most of them tricky
    t = read_trace(p)
    assert t.num_rows == 3000 and set(t.column("name").to_pylist()) == {'a"}, {"b'}
    assert t.column("external_id").to_pylist() == list(range(3000))
    # the bare array form, an empty array, and a document cut after its events
    (tmp_path / "bare.json").write_text(json.dumps(tricky[:5]))
    assert read_trace(tmp_path / "bare.json").num_rows == 5
    (tmp_path / "empty.json").write_text('{"traceEvents": [ ], "x": 1}')
    assert read_trace(tmp_path / "empty.json").num_rows == 0
    whole = p.read_bytes()
    for cut in (len(whole) - 5, len(whole) // 2):
        (tmp_path / "cut.json").write_bytes(whole[:cut])
        with pytest.raises(TraceError, match="not valid JSON"):
            read_trace(tmp_path / "cut.json")


def test_held_batches_are_finished_in_memory(monkeypatch) -> None:
    whole = table_of(SAMPLED)
    from tracealyze.analyzer.ingest import chunks as trace_chunks

    monkeypatch.setattr(trace_chunks, "CHUNK", 64 << 10)  # several batches, all held
    monkeypatch.setattr(trace_stream, "assign_steps", None)  # no scratch file, no DuckDB
    assert read_trace(SAMPLED).equals(whole)


@pytest.mark.parametrize("chosen", [None, "jemalloc"])
def test_ingest_allocates_from_malloc_unless_the_user_chose_a_pool(
        chosen: str | None, tmp_path: Path, monkeypatch) -> None:
    """mimalloc's page purging made imports 0.19 or 0.25 s run to run: the ingest uses the C
    library's malloc meanwhile, leaves the process's pool as it found it, and leaves a pool
    the user chose (ARROW_DEFAULT_MEMORY_POOL) alone."""
    import pyarrow as pa

    if chosen:
        monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", chosen)
    else:
        monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    before = pa.default_memory_pool().backend_name
    seen = []
    real = trace_stream.write_in_memory

    def spy(*a, **k):
        seen.append(pa.default_memory_pool().backend_name)
        return real(*a, **k)

    monkeypatch.setattr(trace_stream, "write_in_memory", spy)
    trace_stream.ingest(SAMPLED, tmp_path / "o.parquet")
    assert seen == [before if chosen else "system"]
    assert pa.default_memory_pool().backend_name == before
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "o.parquet").num_rows == table_of(SAMPLED).num_rows
