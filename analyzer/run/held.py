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
            pre.offer(name, lambda sql=sql: sql, rows, parts)
        read = pre.done()
    except BaseException:
        pre.cancel()
        raise
    return {name: read.get(name, sql) for name, sql, _, _ in jobs}


class Prefetch:
    """The tables of an uncompacted run read into memory as soon as their parts are known,
    while the footers of the next table are still being read: the footers are Python work,
    the reads DuckDB's, and on two cores they overlap (16,000 parts: 3.2 s -> see
    benchmarks/many_parts.py). The connection is made on the first table worth holding
    (``connect()``); ``con`` stays None when there is none."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self.con: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._jobs: dict[str, Future[None]] = {}
        self._threads: int | None = None

    def offer(self, name: str, sql: Callable[[], str], rows: int, parts: int) -> None:
        """Hold table ``name`` (its view's ``sql()``) if it is uncompacted and fits."""
        if parts <= HOLD_PARTS or rows > HELD_ROWS:
            return
        if self._pool is None:
            self.con = self._connect()
            (self._threads,) = execute_one(self.con, "SELECT current_setting('threads')"
                                           ).fetchone()
            # A held table averages under HELD_ROWS / HOLD_PARTS (~19,500) rows a part: small
            # files, which DuckDB schedules poorly across its threads (4,000 two-row parts:
            # 0.55 s on one thread, 0.94 s on two). One thread per table, tables side by side.
            execute_one(self.con, "SET threads = 1")
            self._pool = ThreadPoolExecutor(min(4, os.cpu_count() or 1))
        self._jobs[name] = self._pool.submit(_read, self.con, name, sql())

    def done(self) -> dict[str, str]:
        """Wait for every read; the SQL that reads each held table. Raises the first
        read's error."""
        try:
            for job in self._jobs.values():
                job.result()
        finally:
            self._finish()
        return {name: f"SELECT * FROM {name}" for name in self._jobs}

    def cancel(self) -> None:
        """Wait for the reads already started (they hold a cursor) and forget them."""
        for job in self._jobs.values():
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
