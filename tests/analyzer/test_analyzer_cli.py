"""CLI, catalog, config and summary: contract behaviour and bad input (exit 2, one line)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from tracealyze.analyzer.cli import main
from tracealyze.analyzer.diagnosis.summary import build_summary
from tracealyze.analyzer.run.catalog import open_run
from tracealyze.analyzer.sql.schema import TABLE_NAMES, columns

from tests.analyzer.cli_helpers import bad
from tests.runfactory import listing, make_run, truncate_part, write_part, write_run_json


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def run(tmp_path):
    return make_run(tmp_path, steps=60, tensors=4, parts=2)


# ---------------------------------------------------------------- catalog

def test_views_cover_all_ranks_and_parts_and_empty_tables_have_columns(tmp_path):
    r = make_run(tmp_path, steps=30, ranks=2, parts=3)
    with open_run(r) as run:
        assert run.ranks == [0, 1]
        tables = {name: (cols, n) for name, cols, n in run.tables()}
        assert list(tables) == list(TABLE_NAMES)
        assert tables["steps"][1] == 60
        assert tables["system"][1] == 0
        for name in TABLE_NAMES:
            assert [c for c, _ in tables[name][0]] == columns(name)


def test_merged_part_supersedes_singles_and_tmp_files_are_ignored(tmp_path):
    r = make_run(tmp_path, steps=30, parts=3)
    rows = [{"step": s, "loss": 1.0} for s in range(30)]
    write_part(r, "steps", 0, rows, (1, 3))  # kill between merge rename and deletes
    (r / "steps" / "rank=0" / "part-000004.parquet.tmp").write_bytes(b"junk")
    with open_run(r) as run:
        assert run.row_count("steps") == 30
        assert run.skipped_parts == []


def test_truncated_part_is_skipped_and_reported(tmp_path, runner):
    r = make_run(tmp_path, steps=30, parts=3)
    truncate_part(r / "steps" / "rank=0" / "part-000002.parquet")
    with open_run(r) as run:
        assert run.row_count("steps") == 20
        assert [p.name for p, _ in run.skipped_parts] == ["part-000002.parquet"]
    res = runner.invoke(main, ["summary", str(r), "--json"])
    assert res.exit_code == 0, res.output
    ids = [f["id"] for f in json.loads(res.stdout)["findings"]]
    assert "dropped_data" in ids


def test_nan_rows_are_found_by_where_filters(tmp_path):
    # DuckDB prunes NaN rows with Parquet min/max stats unless told not to (duckdb#25521)
    r = make_run(tmp_path, steps=200, loss=lambda s: np.where(s >= 120, np.nan, 1.0))
    with open_run(r) as run:
        for where in ("isnan(loss)", "NOT isfinite(loss)", "loss > 1e300", "NOT (loss < 10)"):
            assert run.query(f"SELECT count(*) FROM steps WHERE {where}")[1] == [(80,)], where


def test_analyzer_writes_nothing_into_the_run(run, runner):
    before = listing(run)
    for args in (["tables", str(run)], ["summary", str(run), "--json"],
                 ["query", str(run), "SELECT count(*) FROM tensor_stats"]):
        res = runner.invoke(main, args)
        assert res.exit_code == 0, res.output
    assert listing(run) == before


# ---------------------------------------------------------------- CLI happy paths

def test_tables_and_query_formats(run, runner):
    res = runner.invoke(main, ["tables", str(run)])
    assert res.exit_code == 0, res.output
    assert "steps  (60 rows)" in res.output and "trace_events  (0 rows)" in res.output
    sql = "SELECT step, loss FROM steps ORDER BY step LIMIT 3"
    res = runner.invoke(main, ["query", str(run), sql, "--format", "csv"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    assert lines[0] == "step,loss" and len(lines) == 4 and lines[1].startswith("0,")
    res = runner.invoke(main, ["query", str(run), sql, "--format", "json"])
    assert [r["step"] for r in json.loads(res.stdout)] == [0, 1, 2]
    res = runner.invoke(main, ["query", str(run), sql])
    assert "(3 rows)" in res.stdout


def test_summary_json_contract_and_fail_on(tmp_path, runner):
    healthy = make_run(tmp_path, name="ok", steps=100, tensors=4)
    res = runner.invoke(main, ["summary", str(healthy), "--json", "--fail-on", "warning"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["schema_version"] == 1
    assert s["run"]["status"] == "completed" and s["run"]["steps"] == 100
    assert s["run"]["ranks"] == [0]
    assert "gpu_time" not in s
    leak = make_run(tmp_path, name="leak", steps=300, rss=lambda st: 1.5e9 + st * 2**21)
    res = runner.invoke(main, ["summary", str(leak), "--json", "--fail-on", "error"])
    assert res.exit_code == 1, res.output
    f = json.loads(res.stdout)["findings"][0]
    assert {"id", "severity", "title", "message", "first_step", "subject", "evidence"} <= set(f)
    assert f["id"] == "memory_leak"
    assert runner.invoke(main, ["summary", str(leak), "--fail-on", "critical"]).exit_code == 0
    # --set and --config raise the threshold: the gate passes
    res = runner.invoke(main, ["summary", str(leak), "--fail-on", "error",
                               "--set", "memory_leak.min_slope_bytes=1e7"])
    assert res.exit_code == 0, res.output
    cfg = tmp_path / "th.toml"
    cfg.write_text("[memory_leak]\nenabled = false\n")
    res = runner.invoke(main, ["summary", str(leak), "--fail-on", "error", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    jcfg = tmp_path / "th.json"
    jcfg.write_text(json.dumps({"leak": {"min_growth_bytes": 1e12}}))
    res = runner.invoke(main, ["summary", str(leak), "--fail-on", "error", "--config", str(jcfg)])
    assert res.exit_code == 0, res.output


def test_summary_text_is_readable(tmp_path, runner):
    r = make_run(tmp_path, steps=300, rss=lambda st: 1.5e9 + st * 2**21)
    res = runner.invoke(main, ["summary", str(r)])
    assert res.exit_code == 0, res.output
    assert "ERROR" in res.stdout and "memory_leak" in res.stdout and "Try:" in res.stdout


def test_detector_exception_becomes_a_visible_error(run, monkeypatch):
    from tracealyze.analyzer.diagnosis.detectors import loss_spike

    def boom(ctx, th):
        raise ZeroDivisionError("synthetic")

    monkeypatch.setattr(loss_spike, "detect", boom)
    s = build_summary(run)
    (f,) = [f for f in s["findings"] if f["id"] == "loss_spike"]
    assert f["severity"] == "error" and "ZeroDivisionError" in f["message"]


def test_every_command_has_help_with_an_example(runner):
    cmds = list(main.commands)
    assert set(cmds) >= {"tables", "query", "summary", "report", "import-trace"}
    for name in [None, *cmds]:
        res = runner.invoke(main, ([name] if name else []) + ["--help"])
        assert res.exit_code == 0, res.output
        assert "Example:" in res.output and "tracealyze " in res.output, name


def test_help_and_summary_do_not_import_torch(run):
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from tracealyze.analyzer.cli import main\n"
        "r = CliRunner().invoke(main, ['--help'])\n"
        "assert r.exit_code == 0\n"
        "assert 'duckdb' not in sys.modules, 'duckdb imported for --help'\n"
        f"r = CliRunner().invoke(main, ['summary', {str(run)!r}])\n"
        "assert r.exit_code == 0, r.output\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- bad input

def test_bad_input_exits_2_with_one_line(tmp_path, run, runner):
    assert "no such directory" in bad(runner.invoke(main, ["summary", str(tmp_path / "nope")]))
    (tmp_path / "plain").mkdir()
    assert "not a run directory" in bad(runner.invoke(main, ["tables", str(tmp_path / "plain")]))
    empty = tmp_path / "empty"
    write_run_json(empty)
    assert "no recorded data" in bad(runner.invoke(main, ["summary", str(empty)]))
    newer = tmp_path / "newer"
    write_run_json(newer, schema_version=99)
    assert "newer" in bad(runner.invoke(main, ["tables", str(newer)]))
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "run.json").write_text('{"schema_vers')
    assert "cannot read" in bad(runner.invoke(main, ["summary", str(tmp_path / "torn")]))
    assert "syntax error" in bad(runner.invoke(main, ["query", str(run), "SELEC 1"]))
    line = bad(runner.invoke(main, ["query", str(run), "SELECT * FROM nope"]))
    assert "nope" in line and "tables: steps" in line
    assert "read statements" in bad(runner.invoke(
        main, ["query", str(run), f"COPY steps TO '{run}/x.csv'"]))
    assert "unknown detector" in bad(runner.invoke(main, ["summary", str(run), "--set",
                                                          "nosuch.x=1"]))
    assert "unknown threshold" in bad(runner.invoke(main, ["summary", str(run), "--set",
                                                           "memory_leak.nosuch=1"]))
    assert "expected a finite float" in bad(runner.invoke(main, ["summary", str(run), "--set",
                                                        "memory_leak.max_p=abc"]))


def test_all_parts_truncated_is_bad_input(tmp_path, runner):
    r = make_run(tmp_path, steps=10)
    for p in r.rglob("part-*.parquet"):
        truncate_part(p)
    assert "unreadable" in bad(runner.invoke(main, ["summary", str(r)]))


def test_a_reader_that_stops_reading_ends_the_command_quietly(run):
    # `tracealyze ... | head -1`: the pipe closes after one line; the command exits 0 with
    # nothing on stderr (not "Error: BrokenPipeError", exit 2)
    cmd = [sys.executable, "-c", "from tracealyze.analyzer.cli import main; main()",
           "query", str(run), "SELECT * FROM range(300000)", "--format", "csv"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert err == ""
