"""``tracealyze query --fleet ROOT "SQL"``: the fleet index as views (``runs``,
``findings``, ``fleet_ranks``), plus every run table (``steps``, ``memory`` ...) across the
fleet's runs with leading ``run_id`` and ``run_path`` columns.

The index is read once, bounded (:mod:`.bounded`), and only its rows of runs under ROOT are
kept (:mod:`.trust`): a stranger's row naming ``/etc`` or another user's run is dropped,
said, and never read. The run tables are built only when the SQL names one, and only over
the runs ``runs_where`` selects (an SQL predicate on ``runs``, evaluated on the index alone:
e.g. ``status = 'crashed'``) that hold such a table; every run table exists whatever runs
are selected (empty when none holds it), so the SQL always binds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..errors import QueryError, RunDirError
from ..run.handle import Views
from ..sql.safe import check_user_sql, execute_one, ident, lock
from ..sql.schema import DUCKDB_TYPES, TABLE_NAMES
from ..sql.schema import TABLES as RUN_TABLES
from .discover import shown
from .index import TABLES, Index, paths, select
from .trust import Roots

VIEW_OF = {"runs": "runs", "findings": "findings", "fleet_ranks": "ranks"}
"""Query view name -> index table (``ranks`` is a run table's word for a partition: the
index's per-rank step times are ``fleet_ranks``)."""
GRADS = ("rank", "step", "name", "norm", "absmax", "mean", "std", "min", "max", "zero_frac",
         "nonfinite")
"""The columns of the ``grads`` view (tensor_stats rows of kind grad)."""


def _trusted(idx: Index, root: str) -> tuple[dict[str, pa.Table], list[str]]:
    """The index's tables, only their rows of runs under ``root`` (each path checked, once);
    and one warning line for the rows dropped."""
    read = idx.read()
    if not read.present:
        why = f" ({read.warnings[0]})" if read.warnings else ""
        raise RunDirError(f"no fleet index at {idx.path}{why}: run `tracealyze fleet {root}` "
                          "first")
    check = Roots([root])
    ok: set[str] = set()
    bad: dict[str, str] = {}
    rows = paths(read.tables["runs"])
    for p in set(rows):  # (each path checked once, however many rows name it)
        why = check.why_not(p)
        if why is None:
            ok.add(str(p))
        elif idx.own or why != "not under the roots":  # (a shared index: other roots' rows)
            bad[str(p)] = why
    notes = []
    if bad:
        first = min(bad)
        notes.append(f"{sum(1 for p in rows if str(p) in bad)} row(s) of the fleet index, never "
                     f"read: {bad[first]} (e.g. {shown(first)[:200]})")
    return {t: select(read.tables[t], ok) for t in TABLES}, notes


def _index_views(tables: dict[str, pa.Table]) -> Callable[[Any], None]:
    """Adds the index views to a connection: tables of the checked rows (the file is never
    read again, so what was checked is what is queried)."""
    def add(con: Any) -> None:
        for view, table in VIEW_OF.items():
            con.register("_fleet_rows", tables[table])
            try:
                execute_one(con, f"CREATE TABLE main.{view} AS SELECT * FROM _fleet_rows")
            finally:
                con.unregister("_fleet_rows")
    return add


def _empty(columns: list[tuple[str, str]]) -> str:
    cols = ", ".join(f"NULL::{DUCKDB_TYPES[typ]} AS {ident(c)}" for c, typ in columns)
    return f"SELECT NULL::VARCHAR AS run_id, NULL::VARCHAR AS run_path, {cols} WHERE FALSE"


def _with_every_table(add: Callable[[Any], None]) -> Callable[[Any], None]:
    """``add``, then an empty view (with its columns) of each run table that no selected run
    holds: ``SELECT count(*) FROM steps`` is 0 on a fleet without steps, not an error."""
    def more(con: Any) -> None:
        add(con)
        have = {r[0] for r in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE schema_name = 'main' AND NOT internal"
        ).fetchall()}
        empty = {t: list(RUN_TABLES[t]) for t in TABLE_NAMES}
        empty["grads"] = [c for c in RUN_TABLES["tensor_stats"] if c[0] in GRADS]
        for name, columns in empty.items():
            if name not in have:
                execute_one(con, f"CREATE VIEW main.{name} AS {_empty(columns)}")
    return more


def _selected(tables: dict[str, pa.Table], runs_where: str | None,
              wanted: set[str]) -> list[str]:
    """Paths of the indexed runs ``runs_where`` selects (all readable runs when None) that
    hold one of the ``wanted`` tables (or may by now: running ones)."""
    from ..run.views import new_connection

    con = new_connection([])
    try:
        _index_views(tables)(con)
        lock(con)
        pred = f"({runs_where})" if runs_where else "TRUE"
        sql = (f"SELECT path, status, tables FROM runs WHERE status <> 'unreadable' AND {pred} "
               "ORDER BY path")
        try:
            check_user_sql(con, sql, {"SELECT"})
            rows = con.execute(sql).fetchall()
        except QueryError as e:
            raise QueryError(f"--runs {runs_where!r}: {e}") from None
        except Exception as e:
            if type(e).__module__.lstrip("_").startswith("duckdb"):
                raise QueryError(f"--runs {runs_where!r}: {' '.join(str(e).split())[:300]}"
                                 ) from None
            raise
    finally:
        con.close()
    return [p for p, status, held in rows
            if held is None or status in ("running", "killed") or wanted & set(held)]


def _names(sql: str) -> set[str]:
    """The tables ``sql`` names; every run table when it cannot tell."""
    from ..sql.schema import tables_named

    named = tables_named(sql, frozenset(VIEW_OF))
    return set(TABLE_NAMES) if named is None else named


def _open_runs(paths: list[str], allow_files: bool, more: Callable[[Any], None]
               ) -> tuple[Views | None, list[str]]:
    """The runs ``paths`` in one connection (None when none can be opened), and what was
    left out: a run that changed since it was indexed and can no longer be opened
    (deleted, emptied) is said in a line, never fatal to the query over the others."""
    from ..run.catalog import scan_run
    from ..run.multirun import open_runs

    try:
        return open_runs(paths, allow_files=allow_files, more_views=more), []
    except RunDirError:
        ok, gone = [], []
        for p in paths:
            try:
                scan_run(p)
                ok.append(p)
            except (RunDirError, OSError) as e:
                gone.append(f"{shown(p)}: {' '.join(str(e).split())[:200]}")
        if not gone:  # (not a run's fault: the error is the answer)
            raise
    if not ok:
        return None, gone
    return open_runs(ok, allow_files=allow_files, more_views=more), gone


def _refused_early(sql: str) -> None:
    """QueryError now for SQL that is not one read: before thousands of runs are opened for
    it, and before anything is said about them."""
    import duckdb

    con = duckdb.connect(":memory:")
    try:
        check_user_sql(con, sql)
    finally:
        con.close()


def open_fleet(root: str | Path, sql: str, *, index: str | Path | None = None,
               runs_where: str | None = None, allow_files: bool = False) -> Views:
    """A read-only connection for ``sql`` over the fleet under ``root``: RunDirError when
    it has no index yet (``tracealyze fleet ROOT`` makes it). ``.skipped`` says what was
    left out (rows of the index naming no run under ``root``, runs gone since)."""
    _refused_early(sql)
    idx = Index.of([str(root)], index)
    tables, notes = _trusted(idx, str(root))
    wanted = _names(sql) & set(TABLE_NAMES)
    # (a --runs predicate is checked even when no run table is named: a typo is said)
    paths = _selected(tables, runs_where, wanted) if wanted or runs_where else []
    more = _with_every_table(_index_views(tables))
    runs, gone = _open_runs(paths, allow_files, more) if wanted and paths else (None, [])
    notes += gone
    if runs is not None:
        runs.skipped[:0] = notes
        return runs
    from ..run.views import new_connection

    con = new_connection([], allow_files=allow_files)
    try:
        more(con)
        lock(con)
    except BaseException:
        con.close()
        raise
    views = Views()
    views.con = con
    views.skipped = notes  # type: ignore[attr-defined]
    return views


__all__ = ["TABLES", "open_fleet"]
