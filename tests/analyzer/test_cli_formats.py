"""One output flag for every command (issue 46 item 4): ``--format table|csv|json`` on
summary, tables, query, compare and fleet, with ``--json`` its alias; csv rows parse back
into what the JSON holds."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner
from tracealyze.analyzer.cli import main

from tests.runfactory import make_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    rng = np.random.default_rng(0)
    a = make_run(root, name="a", steps=80, loss=2.0 - np.arange(80) / 100)
    b = make_run(root, name="b", steps=80, loss=2.3 + 0.02 * rng.normal(0, 1, 80))
    return root, a, b


def cli(*args: str) -> str:
    res = CliRunner().invoke(main, list(args))
    assert res.exit_code == 0, res.output
    return res.stdout


def parse_csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_summary_csv_is_its_findings_in_order(runs):
    _, _, b = runs
    as_json = json.loads(cli("summary", str(b), "--format", "json"))
    alias = json.loads(cli("summary", str(b), "--json"))  # (--json: the same document)
    assert alias["findings"] == as_json["findings"] and alias.keys() == as_json.keys()
    rows = parse_csv(cli("summary", str(b), "--format", "csv"))
    assert [r["id"] for r in rows] == [f["id"] for f in as_json["findings"]]
    assert rows and rows[0]["id"] == "loss_plateau"  # b never learns
    assert [r["first_step"] for r in rows] == [
        "" if f["first_step"] is None else str(f["first_step"]) for f in as_json["findings"]]


def test_tables_csv_and_json_agree(runs):
    _, a, _ = runs
    listing = json.loads(cli("tables", str(a), "--format", "json"))
    rows = parse_csv(cli("tables", str(a), "--format", "csv"))
    assert {r["table"] for r in rows} == {t["table"] for t in listing if t["columns"]}
    steps = next(t for t in listing if t["table"] == "steps")
    assert steps["rows"] == 80
    assert [r["column"] for r in rows if r["table"] == "steps"] == [
        c["name"] for c in steps["columns"]]
    assert "steps  (80 rows)" in cli("tables", str(a))  # table: the text as before


def test_compare_csv_is_one_row_per_metric(runs):
    _, a, b = runs
    result = json.loads(cli("compare", str(a), str(b), "--format", "json"))
    rows = parse_csv(cli("compare", str(a), str(b), "--format", "csv"))
    assert [r["name"] for r in rows] == [m["name"] for m in result["metrics"]]


def test_fleet_csv_is_one_row_per_run(runs, tmp_path):
    root, a, b = runs
    index = tmp_path / "index"
    rows = parse_csv(cli("fleet", str(root), "--index", str(index), "-j", "1", "-q",
                         "--format", "csv"))
    assert sorted(r["run_id"] for r in rows) == sorted(
        json.loads((p / "run.json").read_text())["run_id"] for p in (a, b))
    assert {r["status"] for r in rows} == {"completed"}


def test_json_and_another_format_together_is_one_line_and_exit_2(runs):
    _, a, _ = runs
    res = CliRunner().invoke(main, ["summary", str(a), "--json", "--format", "csv"])
    assert res.exit_code == 2
    assert "--json and --format csv disagree" in res.output
    assert "Traceback" not in res.output


def test_run_arrow_is_the_same_read_as_query_and_as_guarded(runs):
    from tracealyze.analyzer import open_run
    from tracealyze.analyzer.errors import QueryError

    _, a, _ = runs
    sql = "SELECT step, loss FROM steps ORDER BY step"
    with open_run(a) as run:
        cols, rows = run.query(sql)
        table = run.arrow(sql)
        assert table.column_names == cols
        assert [tuple(r.values()) for r in table.to_pylist()] == rows
        with pytest.raises(QueryError, match="only read statements"):
            run.arrow("CREATE TABLE x AS SELECT 1")
        with pytest.raises(QueryError, match="tables: steps"):
            run.arrow("SELECT * FROM nope")


def test_compare_tells_its_progress_each_stage_in_order(runs):
    from tracealyze.analyzer.compare import runs as cmp

    _, a, b = runs
    told: list[str] = []

    class Told:
        def step(self, label: str) -> None:
            told.append(label)

    result = cmp.compare_runs(a, b, progress=Told())
    assert told == list(cmp.STAGES)
    assert result["verdict"] in ("regressed", "improved", "unchanged", "mixed")
