"""A run directory is data, never code (issue N1): column names from Parquet footers, run ids
from run.json and the run's own path are quoted, never formatted, and every connection is
sandboxed to the runs of the command. Each crafted name is put into a part's footer; every
command that opens the run must leave the file system as it was, and the column must be
readable under its real name."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from tracealyze.analyzer.cli import main
from tracealyze.analyzer.run.catalog import open_run

from tests.runfactory import make_run


def _payloads(target: Path) -> list[str]:
    t = str(target)
    return [
        # the repro: closes the select, COPYs a file, reopens a select
        f"a\" FROM (SELECT 1 AS \"a\"); COPY (SELECT 'pwned' AS l) TO '{t}' (FORMAT csv); "
        "SELECT 1 AS \"a",
        f"x\"; COPY (SELECT 1) TO '{t}'; --",
        f"'; COPY (SELECT 1) TO '{t}'; --",
        f"x\"; ATTACH '{t}' AS evil; --",
        "x\"; INSTALL httpfs; --",
        "x\"; LOAD httpfs; --",
        "x\" , (SELECT content FROM read_text('/etc/passwd')) AS \"leak",
        "x\" , (SELECT count(*) FROM glob('/*')) AS \"leak",
        "x\" , getenv('HOME') AS \"leak",
        "{rank}", "{0}", "{x}", "{}", "}{", "%s", "%(x)s",
        '"', '""', "'", "a\x00b", "semi;colon", "new\nline", "tab\tü€",
        "x" * 1_000_000,
    ]


def _crafted_run(root: Path, name: str, col: str, *, ranks: int = 1) -> Path:
    run = make_run(root, name=name, steps=30, ranks=ranks)
    for r in range(ranks):
        part = sorted((run / "steps" / f"rank={r}").glob("part-*.parquet"))[0]
        t = pq.read_table(part)
        t = t.append_column(pa.field(col, pa.int64()), pa.array([7] * t.num_rows, pa.int64()))
        pq.write_table(t, part)
    return run


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


@pytest.mark.parametrize("i", range(len(_payloads(Path("/t")))))
def test_crafted_column_name_is_a_name(tmp_path: Path, i: int) -> None:
    target = tmp_path / "pwned.csv"
    col = _payloads(target)[i]
    run = _crafted_run(tmp_path, "run", col)
    other = make_run(tmp_path, name="other", steps=30)
    before = _files(tmp_path)
    runner = CliRunner()
    out = tmp_path / "out"
    out.mkdir()
    before.add(out)
    for args in (["summary", str(run)], ["summary", str(run), "--json"], ["tables", str(run)],
                 ["query", str(run), "SELECT count(*) FROM steps"],
                 ["report", str(run), "-o", str(out / "r.html")],
                 ["compare", str(other), str(run), "--json"],
                 ["query", str(run), str(other), "SELECT count(*) FROM steps"]):
        res = runner.invoke(main, args)
        assert res.exit_code in (0, 1), (args, res.output[-500:])
        assert res.exception is None or isinstance(res.exception, SystemExit), args
    created = _files(tmp_path) - before - {out / "r.html"}
    assert created == set(), f"files appeared: {sorted(map(str, created))[:5]}"
    assert not target.exists()
    with open_run(run) as r:
        esc = '"' + col.replace('"', '""') + '"'
        _, rows = r.query(f"SELECT count(*), min({esc}), max({esc}) FROM steps")
    assert rows == [(30, 7, 7)]


def test_crafted_names_with_many_ranks_take_the_one_scan_path(tmp_path: Path) -> None:
    """Past 16 ranks each view is one scan with the rank from the file name: the same quoting."""
    target = tmp_path / "pwned.csv"
    col = _payloads(target)[0]
    run = _crafted_run(tmp_path, "run", col, ranks=18)
    res = CliRunner().invoke(main, ["summary", str(run), "--json"])
    assert res.exit_code in (0, 1), res.output[-500:]
    assert not target.exists()
    with open_run(run) as r:
        _, rows = r.query("SELECT count(DISTINCT rank), count(*) FROM steps")
    assert rows == [(18, 18 * 30)]


def test_run_path_and_run_id_with_quotes_are_literals(tmp_path: Path) -> None:
    target = tmp_path / "pwned.csv"
    evil = f"x'); COPY (SELECT 1) TO '{target}'; --"
    a = make_run(tmp_path, name="it's", steps=20)
    b = make_run(tmp_path, name="b", steps=20)
    meta = json.loads((b / "run.json").read_text())
    meta["run_id"] = evil
    (b / "run.json").write_text(json.dumps(meta))
    res = CliRunner().invoke(main, ["query", str(a), str(b),
                                    "SELECT run_id, count(*) FROM steps GROUP BY 1 ORDER BY 1"])
    assert res.exit_code == 0, res.output
    assert evil in res.output
    assert not target.exists()


@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM glob('/*')",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_parquet('{other}/steps/rank=0/*.parquet')",
    "SET enable_external_access = true",
    "SELECT 1; SELECT 2",
    "COPY (SELECT 1) TO '{target}'",
    "ATTACH '{target}' AS x",
    "INSTALL httpfs",
    "LOAD httpfs",
])
def test_user_sql_reads_only_the_runs_it_was_given(tmp_path: Path, sql: str) -> None:
    run = make_run(tmp_path, name="run", steps=10)
    other = make_run(tmp_path, name="other", steps=10)
    target = tmp_path / "out.csv"
    res = CliRunner().invoke(main, ["query", str(run),
                                    sql.format(other=other, target=target)])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert not target.exists()


def test_allow_files_opts_back_into_reading_other_files(tmp_path: Path) -> None:
    run = make_run(tmp_path, name="run", steps=10)
    other = make_run(tmp_path, name="other", steps=12)
    sql = f"SELECT count(*) AS n FROM read_parquet('{other}/steps/rank=0/*.parquet')"
    res = CliRunner().invoke(main, ["query", str(run), sql, "--allow-files", "--format", "csv"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == ["n", "12"]
    # still never a write
    res = CliRunner().invoke(main, ["query", str(run), f"COPY steps TO '{tmp_path}/x.csv'",
                                    "--allow-files"])
    assert res.exit_code == 2 and not (tmp_path / "x.csv").exists()
