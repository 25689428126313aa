"""The DuckDB side of an opened run: a sandboxed connection (``new_connection``) and one
view per table over the parts scan_run found (``build_views``): uncompacted tables and the
small tables of many ranks held in memory, sharded models combined, raw traces added."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RunDirError
from ..errors import one_line as _one_line
from ..sql.safe import execute_one, ident, sandbox
from ..sql.schema import TABLE_NAMES, TABLES
from . import inplace, shards
from .held import HELD_TRACE_ROWS, HOLD_PARTS, MANY_RANKS, held, held_name, hold_parts
from .meta_views import bins_view, hparams_view
from .raw_traces import load_raw_traces
from .view_sql import view_sql as _view_sql

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .handle import Run


def new_connection(allowed: Iterable[str | Path], *, allow_files: bool = False) -> Any:
    """An in-memory DuckDB connection set up for reading runs, sandboxed to the ``allowed``
    run directories (sqlsafe.sandbox; spill files go to a private temp dir, never next to
    the run we only read). Lock it (sqlsafe.lock) once the views exist."""
    import duckdb

    con = duckdb.connect(":memory:")
    remote = inplace.prefixes([Path(p) for p in allowed])
    if remote:  # runs in object storage, their parts read in place
        inplace.attach(con)
    sandbox(con, allowed, allow_files=allow_files, prefixes=remote)
    con.execute("SET enable_progress_bar = false")
    # Footers read once per file, not once per query (1,024 ranks: every view is 1,024+ files)
    con.execute("SET parquet_metadata_cache = true")
    # Parquet min/max statistics exclude NaN (as the spec says), but DuckDB prunes with
    # them: `WHERE isnan(loss)`, `loss > 1e300` or `NOT (x < 10)` silently drop the NaN
    # rows of pyarrow-written files (duckdb/duckdb#25521, open). NaN is exactly what this
    # tool looks for, so we trade row-group pruning for correct answers.
    con.execute("SET disabled_optimizers = 'filter_pushdown,statistics_propagation'")
    return con


_HELD = ("steps", "memory")


def build_views(con: Any, run: Run, valid: dict[str, list[tuple[Path, Any]]],
                schema: str | None = None, prefetched: dict[str, str] | None = None
                ) -> None:
    """One view per table of ``run`` in ``con`` (in ``schema`` when given: several runs
    share one connection for a multi-run query). RunDirError when DuckDB refuses them."""
    import duckdb

    q = f"{schema}." if schema else ""
    try:
        if schema:
            con.execute(f"CREATE SCHEMA {schema}")
        sqls: dict[str, str] = {}
        jobs = []
        for table in TABLE_NAMES:
            if table == "trace_events":
                continue
            sql = sqls[table] = _view_sql(table, valid[table])
            name = held_name(table, schema)
            if prefetched and name in prefetched:  # read while the footers were checked
                sqls[table] = prefetched[name]
            elif len(valid[table]) > HOLD_PARTS:  # an uncompacted run: read the parts once
                jobs.append((table, name, sql, sum(run.part_rows.get(p, 0)
                                                   for p, _ in valid[table])))
            elif table in _HELD and len(run.ranks) > MANY_RANKS:
                sqls[table] = held(con, sql, name)
        read = hold_parts(con, [(name, sql, rows, len(valid[table]))
                                for table, name, sql, rows in jobs])
        for table, name, _, _ in jobs:
            sqls[table] = read[name]
        for table, sql in sqls.items():
            execute_one(con, f"CREATE VIEW {q}{table} AS {sql}")
        if shards.is_sharded(run.meta):
            shards.combine(con, q)
        # where a user looks first for per-layer gradient norms: one row per step and
        # parameter (the rows of tensor_stats with kind = 'grad')
        execute_one(con, f"CREATE VIEW {q}grads AS SELECT rank, step, name, norm, absmax, "
                         f"mean, std, min, max, zero_frac, nonfinite FROM {q}tensor_stats "
                         "WHERE kind = 'grad'")
        hparams_view(con, run.meta.get("hparams"), q, schema)
        bins_view(con, q, schema)
        tsql = _view_sql("trace_events", valid["trace_events"])
        if len(run.ranks) > MANY_RANKS:
            tsql = held(con, tsql, held_name("trace_events", schema), HELD_TRACE_ROWS)
        execute_one(con, f"CREATE VIEW {q}trace_events AS {tsql}")
        raw = load_raw_traces(run, con, q)
        if raw is not None and raw.num_rows:
            name = f"_raw_trace_events{'_' + schema if schema else ''}"
            con.register(name, raw)
            cols = ", ".join(ident(c) for c, _ in TABLES["trace_events"])
            execute_one(con, f"CREATE OR REPLACE VIEW {q}trace_events AS "
                             f"SELECT {cols} FROM ({tsql}) UNION ALL SELECT {cols} FROM {name}")
    except duckdb.Error as e:
        raise RunDirError(f"cannot open the run's tables: {_one_line(e)}") from e

