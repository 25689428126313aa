"""Open a run directory read-only: one DuckDB view per table over all ranks and parts.

The views are built from explicit file lists rather than globs so that we decide, per file,
what is data (docs/FORMAT.md): only ``part-*.parquet``; a single part covered by a merged
``part-<a>-<b>`` is skipped (a kill between the merge's rename and its deletes leaves both);
a file whose Parquet footer cannot be read (torn write, foreign file) is skipped and named in
``Run.skipped_parts`` so the ``dropped_data`` detector can report it. Nothing is ever written
into the run directory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Self

from tracealyze.format.metaschema import RANK_FIELDS, RUN_FIELDS, check_meta
from tracealyze.format.parts import (
    RANK_FILE_RE,
    is_real_dir,
    is_regular,
    rank_of,
    table_parts,
)
from tracealyze.format.runmeta import Liveness, MetaError, load_json

from ..errors import RunDirError, SchemaVersionError
from ..errors import one_line as _one_line
from ..sql.safe import execute_one, ident, lock, read_query, sandbox
from ..sql.schema import SCHEMA_VERSION, TABLE_NAMES, TABLES
from . import shards
from .footers import validate
from .held import (
    HELD_TRACE_ROWS,
    HOLD_PARTS,
    MANY_RANKS,
    Prefetch,
    held,
    held_name,
    hold_parts,
)
from .live import RELISTS, RetryingConnection, built_despite_merges
from .raw_traces import load_raw_traces
from .view_sql import view_sql as _view_sql


def _read_json(path: Path, fields: dict[str, tuple[type, ...]] = RUN_FIELDS,
               problems: list[str] | None = None) -> dict[str, Any]:
    """A metadata file checked against its schema (format.metaschema): a field of the wrong
    type is left out and named in ``problems``."""
    try:
        meta, bad = check_meta(load_json(path), fields)
    except MetaError as e:
        raise RunDirError(str(e)) from None
    if problems is not None:
        problems += [f"{path.name}: {b}" for b in bad]
    return meta


class Views:
    """A DuckDB connection with the run views (one run's, or several runs'): read-only
    ``query``, and ``close`` / ``with``."""

    con: Any = None  # duckdb.DuckDBPyConnection

    def query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run one read-only SQL statement; ``(column names, rows)``. QueryError on failure."""
        return read_query(self.con, sql)

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Run(Views):
    """An opened run directory. Use :func:`open_run`; close with ``.close()`` or ``with``."""

    def __init__(self, run_dir: Path, meta: dict[str, Any]) -> None:
        self.run_dir: Path = run_dir
        self.meta: dict[str, Any] = meta
        self.rank_meta: dict[int, dict[str, Any]] = {}
        self.skipped_parts: list[tuple[Path, str]] = []
        self.meta_problems: list[str] = []
        self.part_rows: dict[Path, int] = {}  # rows of each readable part (its footer)
        """Fields of run.json / rank files left out for their type (format.metaschema)."""
        self.files: dict[str, list[Path]] = {t: [] for t in TABLE_NAMES}
        self.raw_traces: list[tuple[int, Path]] = []
        self.ranks: list[int] = []
        self.con: Any = None  # duckdb.DuckDBPyConnection, set by open_run
        self._now = time.time()

    # ------------------------------------------------------------------ status

    @property
    def run_id(self) -> str:
        return str(self.meta.get("run_id", ""))

    @property
    def liveness(self) -> Liveness:
        """The format's rule (``tracealyze.format.runmeta``): running, finished or killed."""
        return Liveness(self.meta, self.rank_meta, self._now)

    @property
    def status(self) -> str:
        """completed | crashed | running (FORMAT.md: crashed if any rank crashed, else running
        if any rank runs, else completed). A killed run stays ``running``: see :attr:`killed`."""
        return self.liveness.status

    @property
    def stale_after_s(self) -> float:
        """Heartbeat age beyond which a ``running`` rank is presumed killed."""
        return self.liveness.stale_after_s

    def heartbeat(self, rank: int | None = None) -> float | None:
        """Last heartbeat (epoch s) of ``rank`` (or the newest of all), None if unknown."""
        return self.liveness.heartbeat(rank)

    def heartbeat_age_s(self, rank: int | None = None) -> float | None:
        """Seconds since the last heartbeat (of ``rank`` or the newest), None if unknown."""
        return self.liveness.age_s(rank)

    def stale_ranks(self, max_age_s: float | None = None) -> list[int]:
        """Ranks still marked running whose heartbeat is older than ``max_age_s`` (default
        :attr:`stale_after_s`)."""
        return self.liveness.stale_ranks(max_age_s)

    @property
    def killed(self) -> bool:
        """Status ``running`` but a running rank's heartbeat is stale: killed without a word."""
        return self.liveness.killed

    @property
    def in_progress(self) -> bool:
        """Status ``running`` and every running rank's heartbeat is fresh."""
        return self.liveness.in_progress

    # ------------------------------------------------------------------ data

    def tables(self) -> list[tuple[str, list[tuple[str, str]], int]]:
        """``[(view name, [(column, duckdb type), ...], row count), ...]`` in DESIGN order."""
        out = []
        for name in TABLE_NAMES:
            cols = [(r[0], r[1]) for r in self.con.execute(f"DESCRIBE {name}").fetchall()]
            (count,) = self.con.execute(f"SELECT count(*) FROM {name}").fetchone()
            out.append((name, cols, int(count)))
        return out

    def table_ranks(self, table: str) -> list[int]:
        """Ranks that have readable parts of ``table`` (from the file layout: no scan)."""
        out = {rank_of(f.parent.name) for f in self.files.get(table, [])}
        return sorted(r for r in out if r is not None)

    def row_count(self, table: str) -> int:
        (n,) = self.con.execute(f"SELECT count(*) FROM {table}").fetchone()
        return int(n)

    def __repr__(self) -> str:
        return f"Run({str(self.run_dir)!r}, status={self.status!r}, ranks={self.ranks})"


# ---------------------------------------------------------------------- discovery


def open_run(path: str | Path, *, allow_empty: bool = False, allow_files: bool = False
             ) -> Run:
    """Open ``path`` read-only and build the views. Raises RunDirError / SchemaVersionError.

    ``allow_empty``: accept a run with no readable data part at all (by default it is an
    error: there is nothing to analyse). The connection reads only files under ``path``
    unless ``allow_files`` (``query --allow-files``): sqlsafe.sandbox.
    """
    run, con = _scan_and_connect(path, allow_empty, allow_files)

    def reopen() -> Any:  # a part merged away under a query (live.RetryingConnection)
        fresh, fresh_con = _scan_and_connect(run.run_dir, True, allow_files)
        for name in ("meta", "rank_meta", "skipped_parts", "files", "raw_traces", "ranks"):
            setattr(run, name, getattr(fresh, name))
        return fresh_con

    run.con = RetryingConnection(con, reopen)
    return run


def _scan_and_connect(path: str | Path, allow_empty: bool, allow_files: bool
                      ) -> tuple[Run, Any]:
    """scan_run and a connection with the views (live.built_despite_merges)."""

    def build() -> tuple[Run, Any]:
        pre = Prefetch(lambda: new_connection([Path(path).resolve()],
                                              allow_files=allow_files))

        def offer(run: Run, table: str, good: list[tuple[Path, Any]]) -> None:
            pre.offer(held_name(table), lambda: _view_sql(table, good),
                      sum(run.part_rows.get(p, 0) for p, _ in good), len(good))

        con = None
        try:
            run, valid = scan_run(path, allow_empty=allow_empty, on_table=offer)
            prefetched = pre.done()
            con = pre.con or new_connection([run.run_dir], allow_files=allow_files)
            build_views(con, run, valid, prefetched=prefetched)
            lock(con)
        except BaseException:
            pre.cancel()
            if con is None:
                con = pre.con  # (made for the first held table, or None)
            if con is not None:
                con.close()
            raise
        return run, con

    return built_despite_merges(build)


def scan_run(path: str | Path, *, allow_empty: bool = False,
             on_table: Callable[[Run, str, list[tuple[Path, Any]]], None] | None = None
             ) -> tuple[Run, dict[str, list[tuple[Path, Any]]]]:
    """Read ``path``'s metadata and list its readable parts (no connection yet).
    ``on_table(run, table, parts)``: called as soon as a table's parts are known."""
    run_dir = Path(path)
    try:  # DuckDB takes paths as UTF-8 text: a name that is not cannot be read
        str(run_dir.resolve()).encode("utf-8")
    except UnicodeEncodeError:
        raise RunDirError(f"the run directory's path is not valid UTF-8: "
                          f"{str(run_dir).encode('utf-8', 'backslashreplace').decode()}; "
                          "rename it to read the run") from None
    if not run_dir.exists():
        raise RunDirError(f"no such directory: {run_dir}")
    if not run_dir.is_dir():
        raise RunDirError(f"not a directory: {run_dir}")
    meta_path = run_dir / "run.json"
    if not is_regular(meta_path):
        raise RunDirError(f"not a run directory (no run.json): {run_dir}")
    problems: list[str] = []
    meta = _read_json(meta_path, RUN_FIELDS, problems)
    version = meta.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise RunDirError(f"{meta_path} has no integer schema_version")
    if version < 1:
        raise RunDirError(f"{meta_path} has an invalid schema_version {version}")
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"run format schema_version {version} is newer than this analyzer understands "
            f"({SCHEMA_VERSION}); upgrade tracealyze")

    run = Run(run_dir.resolve(), meta)
    run.meta_problems = problems
    ranks_dir = run_dir / "ranks"
    if is_real_dir(ranks_dir):
        for f in sorted(ranks_dir.iterdir()):
            r = rank_of(f.name, RANK_FILE_RE)
            if r is None or not is_regular(f):
                continue
            try:
                run.rank_meta[r] = _read_json(f, RANK_FIELDS, problems)
            except RunDirError as e:  # one torn rank file must not hide the run
                run.skipped_parts.append((f, str(e)))

    ranks: set[int] = set(run.rank_meta)
    valid: dict[str, list[tuple[Path, Any]]] = {}
    for table in TABLE_NAMES:
        for attempt in range(RELISTS):
            # Only regular files in real rank folders: a link could pull another run's data.
            per_rank = table_parts(run_dir, table)
            files = [f for r in sorted(per_rank) for f in per_rank[r]]
            skipped: list[tuple[Path, str]] = []
            # (the last listing takes what still reads: a writer merging without pause)
            good = validate(files, skipped, table, run.part_rows,
                            relist=attempt < RELISTS - 1)
            if good is not None:
                break
        ranks.update(per_rank)
        valid[table] = good
        run.skipped_parts.extend(skipped)
        run.files[table] = [p for p, _ in valid[table]]
        if on_table is not None and table != "trace_events":
            on_table(run, table, good)
    traces_dir = run_dir / "traces"
    if is_real_dir(traces_dir):
        for entry in sorted(os.scandir(traces_dir), key=lambda e: e.name):
            r = rank_of(entry.name)
            if r is None or not entry.is_dir(follow_symlinks=False):
                continue
            for f in sorted(Path(entry.path).iterdir()):
                if is_regular(f) and (f.name.endswith(".json") or f.name.endswith(".json.gz")):
                    run.raw_traces.append((r, f))
                    ranks.add(r)
    run.ranks = sorted(ranks)

    if (not allow_empty and not any(valid.values()) and not run.raw_traces
            and run.status != "running"):
        # (A running or killed run without data yet is opened: the summary says which.)
        detail = f"; {len(run.skipped_parts)} unreadable part(s)" if run.skipped_parts else ""
        raise RunDirError(f"run has no recorded data (no readable part-*.parquet){detail}: "
                          f"{run_dir}")
    return run, valid


def new_connection(allowed: Iterable[str | Path], *, allow_files: bool = False) -> Any:
    """An in-memory DuckDB connection set up for reading runs, sandboxed to the ``allowed``
    run directories (sqlsafe.sandbox; spill files go to a private temp dir, never next to
    the run we only read). Lock it (sqlsafe.lock) once the views exist."""
    import duckdb

    con = duckdb.connect(":memory:")
    sandbox(con, allowed, allow_files=allow_files)
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
