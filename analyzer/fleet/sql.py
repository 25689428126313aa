"""``tracealyze query --fleet ROOT "SQL"``: the fleet index as views (``runs``,
``findings``, ``fleet_ranks``), plus every run table (``steps``, ``memory`` ...) across the
fleet's runs with leading ``run_id`` and ``run_path`` columns.

The index views read three small files, whatever the fleet's size. The run tables are
built only when the SQL names one, and only over the runs ``runs_where`` selects (an SQL
predicate on ``runs``, evaluated on the index alone: e.g. ``status = 'crashed'``): the
predicate on runs prunes the runs whose parts are scanned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import QueryError, RunDirError
from ..run.handle import Views
from ..sql.safe import check_user_sql, execute_one, literal, lock
from ..sql.schema import TABLE_NAMES
from .index import TABLES, Index, default_index

VIEW_OF = {"runs": "runs", "findings": "findings", "fleet_ranks": "ranks"}
"""Query view name -> index table (``ranks`` is a run table's word for a partition: the
index's per-rank step times are ``fleet_ranks``)."""


def _index_views(idx: Index) -> Any:
    def add(con: Any) -> None:
        for view, table in VIEW_OF.items():
            f = idx.path / table / "data.parquet"
            execute_one(con, f"CREATE VIEW main.{view} AS SELECT * FROM "
                             f"read_parquet({literal(str(f.resolve()))})")
    return add


def _selected(idx: Index, runs_where: str | None) -> list[str]:
    """Paths of the indexed runs ``runs_where`` selects (all readable runs when None)."""
    from ..run.views import new_connection

    con = new_connection([idx.path])
    try:
        _index_views(idx)(con)
        lock(con)
        pred = f"({runs_where})" if runs_where else "TRUE"
        sql = f"SELECT path FROM runs WHERE status <> 'unreadable' AND {pred} ORDER BY path"
        try:
            check_user_sql(con, sql, {"SELECT"})
            return [r[0] for r in con.execute(sql).fetchall()]
        except QueryError as e:
            raise QueryError(f"--runs {runs_where!r}: {e}") from None
        except Exception as e:
            if type(e).__module__.lstrip("_").startswith("duckdb"):
                raise QueryError(f"--runs {runs_where!r}: {' '.join(str(e).split())[:300]}"
                                 ) from None
            raise
    finally:
        con.close()


def _names(sql: str) -> set[str]:
    """The tables ``sql`` names; every run table when it cannot tell."""
    from ..sql.schema import tables_named

    named = tables_named(sql, frozenset(VIEW_OF))
    return set(TABLE_NAMES) if named is None else named


def open_fleet(root: str | Path, sql: str, *, index: str | Path | None = None,
               runs_where: str | None = None, allow_files: bool = False) -> Views:
    """A read-only connection for ``sql`` over the fleet under ``root``: RunDirError when
    it has no index yet (``tracealyze fleet ROOT`` makes it)."""
    idx = Index(index if index is not None else default_index([str(root)]))
    if not idx.exists():
        raise RunDirError(f"no fleet index at {idx.path}: run `tracealyze fleet {root}` first")
    add = _index_views(idx)
    wanted = bool(_names(sql) & set(TABLE_NAMES))
    # (a --runs predicate is checked even when no run table is named: a typo is said)
    paths = _selected(idx, runs_where) if wanted or runs_where else []
    paths = paths if wanted else []
    if paths:
        from ..run.multirun import open_runs

        return open_runs(paths, allow_files=allow_files, also_read=[idx.path],
                         more_views=add)
    from ..run.views import new_connection

    con = new_connection([idx.path], allow_files=allow_files)
    try:
        add(con)
        for table in TABLE_NAMES if wanted else ():
            # no run selected: the run tables exist, empty, so the SQL still binds
            execute_one(con, f"CREATE VIEW main.{table} AS SELECT NULL::VARCHAR AS run_id, "
                             "NULL::VARCHAR AS run_path WHERE FALSE")
        lock(con)
    except BaseException:
        con.close()
        raise
    views = Views()
    views.con = con
    return views


__all__ = ["TABLES", "open_fleet"]
