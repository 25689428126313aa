"""Inputs a hostile tester (or a broken job) hands the CLI: each gets one line and exit 2, and
nothing read from a file becomes a path outside the run directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from tracealyze.analyzer.cli import main
from tracealyze.analyzer.diagnosis.summary import build_summary
from tracealyze.analyzer.run.catalog import open_run

from tests.analyzer.cli_helpers import bad
from tests.runfactory import make_run, write_run_json

REPO = Path(__file__).resolve().parents[2]
SAMPLED = REPO.parent / "shared" / "traces" / "gpu_sampled_rank0.json.gz"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def _trace(path: Path, **extra) -> Path:
    doc = {"traceEvents": [{"ph": "X", "ts": 1, "dur": 5, "name": "aten::mm", "cat": "cpu_op"}],
           **extra}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("evil", ["{victim}", "../../victim.txt", "../traces/../../x"])
def test_import_trace_never_writes_where_the_trace_id_points(tmp_path, runner, evil):
    """The issue's repro: a trace's own trace_id named the copy when the file name was taken,
    so an absolute path or ../.. overwrote any file."""
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    a = _trace(tmp_path / "a" / "worker0", trace_id="benign")
    b = _trace(tmp_path / "b" / "worker0", trace_id=evil.format(victim=victim))
    run = tmp_path / "run"
    for t in (a, b):
        res = runner.invoke(main, ["import-trace", str(t), str(run), "--keep-raw"])
        assert res.exit_code == 0, res.output
    assert victim.read_text() == "original"
    copies = sorted(p.name for p in (run / "traces" / "rank=0").iterdir())
    assert len(copies) == 2 and all("/" not in c and not c.startswith(".") for c in copies)
    outside = {p for p in tmp_path.rglob("*") if p.is_file()} - set(run.rglob("*"))
    assert outside == {victim, a, b}
    with open_run(run) as r:  # both traces are in, once each
        _, rows = r.query("SELECT count(DISTINCT trace_id), count(*) FROM trace_events")
    assert rows == [(2, 2)]


@pytest.mark.parametrize("rank, word", [(2**31, "between 0 and"), (-5, "between 0 and")])
def test_trace_rank_out_of_range_is_refused(tmp_path, runner, rank, word):
    t = _trace(tmp_path / "t.json", distributedInfo={"rank": rank})
    assert word in bad(runner.invoke(main, ["import-trace", str(t), str(tmp_path / "run")]))
    assert not (tmp_path / "run" / "trace_events").exists()


def test_symlinks_inside_a_run_are_not_followed(tmp_path):
    other = make_run(tmp_path, name="other", steps=50)
    run = make_run(tmp_path, name="run", steps=20)
    # a part linked in from another run, a rank folder that is a link, a linked trace
    os.symlink(next((other / "steps" / "rank=0").glob("part-*.parquet")),
               run / "steps" / "rank=0" / "part-000099.parquet")
    os.symlink(other / "steps" / "rank=0", run / "steps" / "rank=1")
    (run / "traces").mkdir()
    os.symlink(SAMPLED.parent, run / "traces" / "rank=0")
    with open_run(run) as r:
        _, rows = r.query("SELECT count(*) FROM steps")
        assert rows == [(20,)] and r.ranks == [0]
        assert r.raw_traces == []
    os.symlink(other / "run.json", run / "link.json")
    (run / "run.json").unlink()
    os.symlink(other / "run.json", run / "run.json")
    with pytest.raises(Exception, match="not a run directory"):
        open_run(run)


def test_run_json_nested_too_deep(tmp_path, runner):
    d = tmp_path / "deep"
    d.mkdir()
    (d / "run.json").write_text("[" * 100_000 + "]" * 100_000)
    assert "nested too deeply" in bad(runner.invoke(main, ["summary", str(d)]))


def test_step_column_of_the_wrong_type_is_skipped_with_a_reason(tmp_path, runner):
    run = make_run(tmp_path, steps=30)
    t = pa.table({"step": pa.array([[1, 2]] * 3, pa.list_(pa.int64())),
                  "loss": pa.array([1.0, 2.0, 3.0])})
    pq.write_table(t, run / "steps" / "rank=0" / "part-000077.parquet")
    res = runner.invoke(main, ["summary", str(run), "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["run"]["steps"] == 30
    (f,) = [f for f in s["findings"] if f["id"] == "dropped_data"]
    assert "list<" in f["message"] and "expected int64" in f["message"]


@pytest.mark.parametrize("setting, word", [
    ("memory_leak.min_slope_bytes=inf", "finite"), ("memory_leak.min_steps=1e400", "finite"),
    ("loss_spike.z=nan", "finite"), ("loss_spike.window=-5", ">= 0"),
    ("loss_spike.window=0", ">= 1"), ("memory_leak.warmup_frac=2", "between 0 and 1"),
])
def test_thresholds_are_range_checked(tmp_path, runner, setting, word):
    run = make_run(tmp_path, steps=30)
    assert word in bad(runner.invoke(main, ["summary", str(run), "--set", setting]))


def test_a_detector_that_fails_fails_the_gate(tmp_path, runner, monkeypatch):
    from tracealyze.analyzer.diagnosis.detectors import memory_leak

    monkeypatch.setattr(memory_leak, "detect", lambda ctx, th: 1 / 0)
    run = make_run(tmp_path, steps=40)
    res = runner.invoke(main, ["summary", str(run), "--fail-on", "error"])
    assert res.exit_code == 1 and "memory_leak" in res.stdout and "failed" in res.stdout


def test_killed_before_the_first_flush_is_reported_killed(tmp_path, runner):
    """run.json is written at start with a heartbeat: no data, stale heartbeat = killed."""
    run = tmp_path / "run"
    old = 10_000.0
    write_run_json(run, status="running", ended=None, heartbeat=1.7e9 - old,
                   started=1.7e9 - old - 5)
    res = runner.invoke(main, ["summary", str(run), "--fail-on", "error"])
    assert res.exit_code == 1, res.output
    text = " ".join(res.stdout.split())
    assert "status=killed" in text and "no step had been recorded" in text


def test_young_run_without_data_is_explained(tmp_path, runner):
    import time

    run = tmp_path / "run"
    write_run_json(run, status="running", ended=None, heartbeat=time.time(),
                   started=time.time() - 3)
    res = runner.invoke(main, ["summary", str(run), "--fail-on", "warning"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "in progress" in text.lower() and "no step has been recorded yet" in text


def test_killed_long_after_a_heartbeat_by_the_documented_rule(tmp_path):
    from tracealyze.format.runmeta import stale_after_s

    assert stale_after_s(10.0) == 60.0 and stale_after_s(2.0) == 36.0
    fresh = make_run(tmp_path, name="fresh", steps=20, status="running", heartbeat_age_s=50)
    stale = make_run(tmp_path, name="stale", steps=20, status="running", heartbeat_age_s=70)
    assert [f["severity"] for f in build_summary(fresh)["findings"]
            if f["id"] == "training_crashed"] == ["info"]
    assert [f["severity"] for f in build_summary(stale)["findings"]
            if f["id"] == "training_crashed"] == ["error"]


@pytest.mark.parametrize("doc, word", [
    ('{"traceEvents": {"a": 1}}', "no 'traceEvents' list"),
    ('{"distributedInfo": {"rank": 1.5}, "traceEvents": [{"ph": "X", "ts": 1, "dur": 2, '
     '"name": "a", "cat": "cpu_op"}]}', "not an integer rank"),
    ('{"distributedInfo": {"rank": true}, "traceEvents": []}', "not an integer rank"),
    ('{"x": ' + "[" * 5000 + "1" + "]" * 5000 + ', "traceEvents": [{"ph": "X", "ts": 1, '
     '"dur": 2, "name": "a", "cat": "cpu_op"}]}', "levels deep"),
    ('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2, "name": "a", "cat": "cpu_op"}], '
     '"distributedInfo": ' + "[" * 5000, "levels deep"),
])
def test_import_trace_refuses_odd_documents_in_one_line(tmp_path, runner, doc, word):
    """N15: a traceEvents object gave exit 0 and events=0; rank 1.5 silently became 1."""
    trace = tmp_path / "t.json"
    trace.write_text(doc)
    res = runner.invoke(main, ["import-trace", str(trace), str(tmp_path / "run")])
    assert res.exit_code == 2, res.output
    assert word in bad(res) and "Traceback" not in res.output
    assert not (tmp_path / "run" / "trace_events").exists()


def test_import_trace_of_a_fifo_is_one_line_not_a_hang(tmp_path, runner):
    fifo = tmp_path / "t.json"
    os.mkfifo(fifo)
    res = runner.invoke(main, ["import-trace", str(fifo), str(tmp_path / "run")])
    assert res.exit_code == 2 and "not a regular file" in bad(res)
