"""Huge strings from a run (issue N11, N17): a 20 MB kernel name or a 50 MB event message is
kept whole in the tables, and shown cut in the summary, its JSON and the report (a 100 MB
message made a 49 MB report; a 150 MB name a summary that printed all of it)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from tracealyze.analyzer.cli import main

from tests.runfactory import make_run


def _invoke(*args: str) -> str:
    res = CliRunner().invoke(main, list(args))
    assert res.exit_code in (0, 1), res.output[-500:]
    return res.output


def test_a_huge_kernel_name_is_kept_whole_and_shown_cut(tmp_path: Path) -> None:
    name = "void kernel<" + "x" * 20_000_000 + ">"
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "ts": 0, "dur": 5, "name": "cudaLaunchKernel", "cat": "cuda_runtime",
         "args": {"correlation": 1}},
        {"ph": "X", "ts": 1, "dur": 2, "name": name, "cat": "kernel",
         "args": {"stream": 7, "correlation": 1}}]}))
    run = tmp_path / "run"
    _invoke("import-trace", str(trace), str(run))
    assert len(_invoke("summary", str(run))) < 50_000
    assert len(_invoke("summary", str(run), "--json")) < 50_000
    _invoke("report", str(run), "-o", str(tmp_path / "r.html"))
    assert (tmp_path / "r.html").stat().st_size < 5_000_000
    out = _invoke("query", str(run), "SELECT max(length(name)) AS n FROM trace_events",
                  "--format", "csv")
    assert out.splitlines()[1] == str(len(name))


def test_a_huge_event_message_is_kept_whole_and_shown_cut(tmp_path: Path) -> None:
    message = "boom " * 10_000_000  # 50 MB
    run = make_run(tmp_path, steps=30, events=[
        {"step": 5, "kind": "exception", "severity": "error", "message": message,
         "subject": "s" * 5_000_000, "stack": "frame\n" * 2_000_000}])
    assert len(_invoke("summary", str(run))) < 50_000
    assert len(_invoke("summary", str(run), "--json")) < 50_000
    _invoke("report", str(run), "-o", str(tmp_path / "r.html"))
    html = (tmp_path / "r.html").read_text()
    assert len(html) < 5_000_000 and "more characters" in html
    out = _invoke("query", str(run), "SELECT length(message) AS n FROM events", "--format",
                  "csv")
    assert out.splitlines()[1] == str(len(message))


def test_deeply_nested_traces_are_refused_in_one_line(tmp_path: Path) -> None:
    """`[` x 200,000 took 23 GB and the OOM killer (ijson keeps a prefix per level); 20,000
    gave a RecursionError traceback. Kineto nests a few levels: past 1024, one line."""
    for i, text in enumerate(["[" * 200_000, '{"traceEvents": ' + "[" * 20_000,
                              '{"traceEvents": [' + '{"a": ' * 5_000]):
        trace = tmp_path / f"deep{i}.json"
        trace.write_text(text)
        res = CliRunner().invoke(main, ["import-trace", str(trace), str(tmp_path / f"r{i}")])
        assert res.exit_code == 2, res.output[-300:]
        assert "levels deep" in res.output and "Traceback" not in res.output
    # deep args inside one event (past orjson's 255 levels): the event is kept, its args not
    args: list = []
    inner = args
    for _ in range(300):
        inner.append([])
        inner = inner[0]
    trace = tmp_path / "deep_args.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "ts": 1, "dur": 2, "name": "k", "cat": "kernel", "args": {"a": args}}]}))
    run = tmp_path / "r_args"
    _invoke("import-trace", str(trace), str(run))
    out = _invoke("query", str(run), "SELECT count(*) AS n FROM trace_events", "--format", "csv")
    assert out.splitlines()[1] == "1"
