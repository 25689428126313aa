"""Tables read once into memory when querying their files again would cost more than holding
them: a run left uncompacted (thousands of small parts) and runs of many ranks.

Every query over the files pays for opening each of them again (0.07 s a query at 1,024
ranks; 0.17 s at 4,000 parts), and the analyzer queries these tables dozens of times.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..errors import RunDirError, one_line
from ..sql.safe import execute_one

MANY_RANKS = 16
"""Past this many ranks a job is read and drawn as a distribution: one Parquet scan per table
(``view_sql``), small tables held in memory (here), rank views as bands with the
outliers named (``report.charts.ranks``)."""
HELD_ROWS = 5_000_000
HOLD_PARTS = 256
"""A table of more parts than this (a run left uncompacted) is read once into memory when it
has at most HELD_ROWS rows: a compacted run has one part per rank and table."""
HELD_TRACE_ROWS = 2_000_000
"""Trace events of many ranks are held in memory up to this many (~100 bytes each)."""
def held_name(table: str, schema: str | None = None) -> str:
    """The in-memory table that holds ``table`` of the run in ``schema`` (or the only run)."""
    return f"_held_{schema or 'main'}_{table}"


def held(con: Any, sql: str, name: str, limit: int = HELD_ROWS, rows: int | None = None
         ) -> str:
    """``sql`` read once into a temporary table when it has at most ``limit`` rows; the SQL
    to read it from then. ``rows``: the count, when the footers gave it."""
    if rows is None:
        (rows,) = execute_one(con, f"SELECT count(*) FROM ({sql})").fetchone()
    if rows > limit:
        return sql
    execute_one(con, f"CREATE TEMP TABLE {name} AS {sql}")
    return f"SELECT * FROM {name}"


def hold_parts(con: Any, jobs: list[tuple[str, str, int, int]]) -> dict[str, str]:
    """Read the tables of an uncompacted run into memory, side by side (:class:`Prefetch`,
    with every table known up front: several runs in one connection). ``jobs``: (name,
    sql, rows, parts) per table; returns the SQL that reads each ``name`` (its own ``sql``
    when it is not held)."""
    pre = Prefetch(lambda: con)
    try:
        for name, sql, rows, parts in jobs:
            if parts > HOLD_PARTS and rows <= HELD_ROWS:
                pre.chunk(name, sql, rows)
                pre.listed(name, parts)
        read = pre.done()
    except BaseException:
        pre.cancel()
        raise
    return {name: read.get(name, sql) for name, sql, _, _ in jobs}


CHUNK_PARTS = 500
"""An uncompacted table is read in chunks of this many parts, each as soon as its footers
are checked: reading starts ~0.3 s earlier than after the whole table's footers, and the
last read left when the footers are done is one chunk, not one table (16,000 parts: the
two cores stay busy instead of one waiting 0.6 s on the last table)."""


class Prefetch:
    """The tables of an uncompacted run read into memory while the run is still being
    listed: chunks of parts (``chunk``) read as soon as their footers are checked, while
    the next footers are read. The footers are Python work, the reads DuckDB's, and on two
    cores they overlap (benchmarks/many_parts.py). A table is kept once it is fully listed
    (``listed``) with more than HOLD_PARTS parts and at most HELD_ROWS rows; ``discard``
    forgets one (its parts are listed again). The connection is made on the first chunk
    (``connect()``); ``con`` stays None when there is none."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self.con: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._chunks: dict[str, list[tuple[str, Future[None]]]] = {}
        self._rows: dict[str, int] = {}
        self._too_big: set[str] = set()
        self._kept: list[str] = []
        self._threads: int | None = None

    def chunk(self, name: str, sql: str, rows: int) -> None:
        """Read ``sql`` (some of table ``name``'s parts, ``rows`` rows by their footers)."""
        if name in self._too_big:
            return
        self._rows[name] = self._rows.get(name, 0) + rows
        if self._rows[name] > HELD_ROWS:  # not held: queried from its files
            self.discard(name)
            self._too_big.add(name)
            return
        if self._pool is None:
            self.con = self._connect()
            (self._threads,) = execute_one(self.con, "SELECT current_setting('threads')"
                                           ).fetchone()
            # A held table averages under HELD_ROWS / HOLD_PARTS (~19,500) rows a part: small
            # files, which DuckDB schedules poorly across its threads (4,000 two-row parts:
            # 0.55 s on one thread, 0.94 s on two). One thread per read, reads side by side.
            execute_one(self.con, "SET threads = 1")
            self._pool = ThreadPoolExecutor(min(4, os.cpu_count() or 1))
        chunks = self._chunks.setdefault(name, [])
        part = f"{name}__{len(chunks)}"
        chunks.append((part, self._pool.submit(_read, self.con, part, sql)))

    def listed(self, name: str, parts: int) -> None:
        """Every part of table ``name`` is known (``parts`` of them): keep what was read
        when the table is worth holding."""
        if parts <= HOLD_PARTS or name in self._too_big or name not in self._chunks:
            self.discard(name)
        else:
            self._kept.append(name)

    def discard(self, name: str) -> None:
        """Forget what was read of table ``name``."""
        self._rows.pop(name, None)
        for part, job in self._chunks.pop(name, []):
            try:
                job.result()
            except Exception:  # a part merged away under the read: listed again anyway
                continue
            execute_one(self.con, f"DROP TABLE IF EXISTS {part}")

    def done(self) -> dict[str, str]:
        """Wait for every read and join each kept table's chunks; the SQL that reads each
        held table. A read's DuckDB error is a RunDirError (a part merged away meanwhile:
        live.built_despite_merges lists the run again)."""
        import duckdb

        try:
            for name in self._kept:
                parts = [part for part, job in self._chunks[name]]
                for _, job in self._chunks[name]:
                    job.result()
                if len(parts) == 1:
                    execute_one(self.con, f"ALTER TABLE {parts[0]} RENAME TO {name}")
                else:  # in part order (one thread); a column new in a later chunk: BY NAME
                    execute_one(self.con, f"CREATE TABLE {name} AS " + " UNION ALL BY NAME "
                                .join(f"SELECT * FROM {p}" for p in parts))
                    for p in parts:
                        execute_one(self.con, f"DROP TABLE {p}")
        except duckdb.Error as e:
            raise RunDirError(f"cannot read the run's parts: {one_line(e)}") from e
        finally:
            self._finish()
        return {name: f"SELECT * FROM {name}" for name in self._kept}

    def cancel(self) -> None:
        """Wait for the reads already started (they hold a cursor) and forget them."""
        for chunks in self._chunks.values():
            for _, job in chunks:
                try:
                    job.result()
                except Exception:
                    pass
        self._finish()

    def _finish(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
            if self._threads is not None:
                execute_one(self.con, f"SET threads = {int(self._threads)}")


def _read(con: Any, name: str, sql: str) -> None:
    cur = con.cursor()  # one connection per reader: DuckDB runs each on its own thread
    try:
        execute_one(cur, f"CREATE TABLE {name} AS {sql}")
    finally:
        cur.close()
