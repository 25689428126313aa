"""`tracealyze query RUN_A RUN_B ... "SQL"`: every view covers all runs with a run_id column;
sharded and trace-only runs keep their own view logic; bad input is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from tracealyze.analyzer.cli import main
from tracealyze.analyzer.run.catalog import open_run
from tracealyze.analyzer.run.multirun import open_runs

from tests.runfactory import make_run
from tests.traces.trace_helpers import SAMPLED


def q(*args: object) -> object:
    res = CliRunner().invoke(main, ["query", *map(str, args)])
    return res


def test_a_sweep_lines_up_in_sql(tmp_path: Path) -> None:
    runs = [make_run(tmp_path, name=f"lr{i}", steps=50 + 10 * i, seed=i, tensors=2,
                     loss=lambda s, i=i: 3.0 - 0.01 * (i + 1) * s / 10) for i in range(3)]
    res = q(*runs, "SELECT run_id, count(*) AS n, min(loss) AS best FROM steps "
                   "GROUP BY run_id ORDER BY n", "--format", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    ids = [json.loads((r / "run.json").read_text())["run_id"] for r in runs]
    assert [r["run_id"] for r in rows] == ids and [r["n"] for r in rows] == [50, 60, 70]
    # each run's own numbers, as a one-run query gives them
    for run, row in zip(runs, rows, strict=True):
        with open_run(run) as one:
            (best,) = one.query("SELECT min(loss) FROM steps")[1][0]
        assert row["best"] == pytest.approx(best)
    # every view gains the column, first
    with open_runs(runs) as rs:
        for view in ("steps", "tensor_stats", "memory", "events", "trace_events"):
            cols, _ = rs.query(f"SELECT * FROM {view} LIMIT 0")
            assert cols[:2] == ["run_id", "run_path"], view
        _, paths = rs.query("SELECT DISTINCT run_id, run_path FROM steps ORDER BY 1")
        assert {p for _, p in paths} == {str(r) for r in runs}
        cols, rows = rs.query("SELECT run_id, count(DISTINCT name) FROM tensor_stats "
                              "GROUP BY ALL ORDER BY 1")
        assert len(rows) == 3 and {r[1] for r in rows} == {2}


def test_a_non_run_directory_in_a_glob_is_skipped_with_a_warning(tmp_path: Path) -> None:
    runs = [make_run(tmp_path, name=f"r{i}", steps=10) for i in range(2)]
    logs = tmp_path / "logs"
    logs.mkdir()
    res = CliRunner().invoke(main, ["query", str(runs[0]), str(logs), str(runs[1]),
                                    "SELECT count(DISTINCT run_id) FROM steps"])
    assert res.exit_code == 0, res.output
    assert f"warning: skipped {logs}: not a run directory" in res.stderr
    assert "2" in res.stdout
    (tmp_path / "ckpt").mkdir()
    alone = CliRunner().invoke(main, ["query", str(logs), str(tmp_path / "ckpt"), "SELECT 1"])
    assert alone.exit_code == 2 and "none of the directories given is a run" in alone.stderr


def test_sharded_and_trace_runs_keep_their_views(tmp_path: Path) -> None:
    sharded = make_run(tmp_path, name="fsdp", steps=20, ranks=2, tensors=1,
                       grad_norm={0: 3.0, 1: 4.0}, run_meta={"model": {"sharded": True}})
    plain = make_run(tmp_path, name="plain", steps=20, grad_norm=5.0)
    from tracealyze.analyzer.ingest.importer import import_traces

    traced = tmp_path / "traced"
    import_traces([SAMPLED], traced)
    with open_runs([sharded, plain, traced]) as rs:
        _, rows = rs.query("SELECT run_id, median(grad_norm) FROM steps GROUP BY ALL "
                           "ORDER BY 2")
        # the sharded run's norm is combined over ranks: sqrt(3² + 4²)
        assert [r[1] for r in rows] == [pytest.approx(5.0), pytest.approx(5.0)]
        _, shards = rs.query("SELECT DISTINCT run_id FROM steps_shards")
        assert [r[0] for r in shards] == [rs.run_ids[0]]
        _, kernels = rs.query("SELECT run_id, count(*) FROM trace_events WHERE cat = 'kernel' "
                              "GROUP BY ALL")
        assert kernels == [(rs.run_ids[2], 1154)]


def test_copied_run_ids_stay_apart_and_bad_input_is_one_line(tmp_path: Path) -> None:
    import shutil

    a = make_run(tmp_path, name="a", steps=10)
    b = tmp_path / "copy" / "a"
    shutil.copytree(a, b)
    with open_runs([a, b]) as rs:
        assert len(set(rs.run_ids)) == 2
        _, rows = rs.query("SELECT run_id, count(*) FROM steps GROUP BY ALL")
        assert sorted(r[1] for r in rows) == [10, 10]
    for args, message in (
        ((a, a, "SELECT 1"), "the same run is given twice"),
        ((a, tmp_path / "nope", "SELECT 1"), "no such directory"),
        ((a, b, "DROP VIEW steps"), "only read statements"),
        ((a, b, "SELECT * FROM stepz"), "tables: steps"),
    ):
        res = q(*args)
        assert res.exit_code == 2, res.output
        assert message in res.output and "Traceback" not in res.output
        assert len(res.output.strip().splitlines()) == 1, res.output
