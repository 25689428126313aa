"""`query`'s SQL by allow-list (issue 42): exactly one SELECT (WITH, DESCRIBE, SUMMARIZE, SHOW,
VALUES, FROM-first) or an EXPLAIN of one SELECT; everything else is refused in one line before
it reaches a connection, whatever --allow-files says. Nothing is ever written."""

from __future__ import annotations

import itertools
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from tracealyze.analyzer.cli import main
from tracealyze.analyzer.errors import QueryError
from tracealyze.analyzer.sql.safe import check_user_sql

from tests.analyzer.cli_helpers import bad
from tests.runfactory import make_run

WRITES = [
    "COPY (SELECT 1) TO '{t}'",
    "COPY steps TO '{t}' (FORMAT parquet)",
    "EXPORT DATABASE '{d}'",
    "ATTACH '{t}' AS x",
    "INSTALL httpfs",
    "LOAD httpfs",
    "CALL pragma_version()",
    "PRAGMA version",
    "SET enable_external_access = true",
    "CREATE TABLE t AS SELECT 1",
    "CREATE VIEW v AS SELECT 1",
    "CREATE MACRO m() AS 1",
    "DROP VIEW steps",
    "INSERT INTO steps VALUES (1)",
    "PIVOT (SELECT 1 a, 2 b) ON a USING sum(b)",
    "CHECKPOINT",
    "DETACH memory",
    "USE memory",
    "PREPARE p AS SELECT 1",
]
PREFIXES = ["", "EXPLAIN ", "EXPLAIN ANALYZE ", "explain analyse ", "EXPLAIN (FORMAT json) ",
            "/* x */ EXPLAIN -- y\n ANALYZE ", "EXPLAIN ANALYZE /* ( */ "]
READS = ["SELECT 1", "WITH a AS (SELECT 1 AS x) SELECT x FROM a", "DESCRIBE SELECT 1",
         "SUMMARIZE SELECT 1 AS x", "EXPLAIN SELECT 1", "EXPLAIN ANALYZE SELECT 1",
         "EXPLAIN (FORMAT json) SELECT 1", "SHOW TABLES", "VALUES (1), (2)", "FROM range(3)",
         "PIVOT (SELECT 1 a, 2 b) ON a IN (1) USING sum(b)",
         "(SELECT 1) UNION ALL (SELECT 2)", "-- a comment\nSELECT 1 /* trailing */"]


@pytest.fixture(scope="module")
def con():
    c = duckdb.connect()
    yield c
    c.close()


@pytest.mark.parametrize("sql", READS)
def test_reads_are_allowed(con, sql: str) -> None:
    check_user_sql(con, sql)


@pytest.mark.parametrize("stmt, prefix", list(itertools.product(WRITES, PREFIXES)))
def test_everything_else_is_refused_whatever_it_is_wrapped_in(con, stmt: str,
                                                              prefix: str) -> None:
    with pytest.raises(QueryError) as e:
        check_user_sql(con, prefix + stmt.format(t="/tmp/x.parquet", d="/tmp/x"))
    assert "\n" not in str(e.value)


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(["explain", "EXPLAIN", "Explain"]),
       analyze=st.sampled_from(["", "analyze", "ANALYZE", "analyse"]),
       gap=st.sampled_from([" ", "\n", "\t", " /* c */ ", " -- c\n "]),
       stmt=st.sampled_from(WRITES))
def test_explain_of_a_write_is_refused_however_spelled(con, case: str, analyze: str, gap: str,
                                                       stmt: str) -> None:
    sql = gap.join(x for x in (case, analyze, stmt.format(t="/tmp/y", d="/tmp/y")) if x)
    with pytest.raises(QueryError):
        check_user_sql(con, sql)


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``root`` (an EXPORT creates a folder)."""
    return {p.relative_to(root).as_posix(): (p.stat().st_size if p.is_file() else -1,
                                             p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


def test_naming_the_tables_of_a_write_binds_nothing(tmp_path: Path) -> None:
    """DuckDB's get_table_names of an EXPORT DATABASE creates its folder: the table lookup
    that picks what a URL query fetches must not bind anything but a read."""
    from tracealyze.analyzer.sql.schema import tables_named

    assert tables_named(f"EXPORT DATABASE '{tmp_path / 'x'}'") is None
    assert tables_named(f"EXPLAIN ANALYZE EXPORT DATABASE '{tmp_path / 'y'}'") is None
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    assert tables_named("SELECT * FROM steps, grads WHERE steps.step = grads.step") == {"steps",
                                                                           "tensor_stats"}


@pytest.mark.parametrize("flags", [[], ["--allow-files"]])
def test_the_issues_explain_analyze_copy_writes_nothing(tmp_path: Path, flags: list[str]) -> None:
    """The repro: EXPLAIN ANALYZE COPY ... TO a recorded part overwrote it (300 steps -> 1,
    exit 0); with --allow-files it could write a .pth file anywhere."""
    run = make_run(tmp_path, name="run", steps=300)
    part = next((run / "steps" / "rank=0").glob("part-*.parquet"))
    before = _files(tmp_path)
    runner = CliRunner()
    for sql in (f"EXPLAIN ANALYZE COPY (SELECT 1 AS step) TO '{part}' (FORMAT parquet)",
                f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{tmp_path / 'evil.pth'}'",
                f"COPY (SELECT 1) TO '{tmp_path / 'x.csv'}'",
                f"EXPORT DATABASE '{tmp_path / 'db'}'"):
        line = bad(runner.invoke(main, ["query", str(run), sql, *flags]))
        assert "never writes" in line
    assert _files(tmp_path) == before
    res = runner.invoke(main, ["query", str(run), "SELECT count(*) AS n FROM steps",
                               "--format", "csv", *flags])
    assert res.exit_code == 0 and res.output.split() == ["n", "300"]
    res = runner.invoke(main, ["query", str(run), "EXPLAIN ANALYZE SELECT count(*) FROM steps",
                               *flags])
    assert res.exit_code == 0, res.output


def test_fleet_query_cannot_overwrite_the_index(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_run(root, name="a", steps=30)
    runner = CliRunner()
    assert runner.invoke(main, ["fleet", str(root)]).exit_code == 0
    index = root / "_tracealyze" / "fleet" / "runs" / "data.parquet"
    before = _files(tmp_path)
    for flags in ([], ["--allow-files"]):
        line = bad(runner.invoke(main, ["query", "--fleet", str(root), *flags,
                                        f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{index}'"]))
        assert "never writes" in line
    assert _files(tmp_path) == before
