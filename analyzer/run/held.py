"""Tables read once into memory when querying their files again would cost more than holding
them: a run left uncompacted (thousands of small parts) and runs of many ranks.

Every query over the files pays for opening each of them again (0.07 s a query at 1,024
ranks; 0.17 s at 4,000 parts), and the analyzer queries these tables dozens of times.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
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
SMALL_PART_ROWS = 65_536
"""Parts smaller than this on average are read one DuckDB thread per table: DuckDB schedules
small files so poorly across its threads that one thread reads 4,000 two-row parts in 0.55 s
against 0.94 s for two; the tables are read side by side instead (2.2 s against 2.7 s for
16,000 parts on two cores)."""


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
    """Read the tables of an uncompacted run into memory, side by side. ``jobs``: (name,
    sql, rows, parts) per table; returns the SQL that reads each ``name`` (its own ``sql``
    when it has more than HELD_ROWS rows). The tables are created in the connection's
    in-memory database (its temporary tables are not shared with the cursors that read in
    parallel); their names start with an underscore."""
    out = {name: sql for name, sql, rows, _ in jobs if rows > HELD_ROWS}
    todo = [(name, sql) for name, sql, rows, _ in jobs if rows <= HELD_ROWS]
    if not todo:
        return out
    small = (sum(r for _, _, r, p in jobs if r <= HELD_ROWS)
             < SMALL_PART_ROWS * sum(p for _, _, r, p in jobs if r <= HELD_ROWS))
    workers = min(len(todo), os.cpu_count() or 1, 4) if small else 1
    (threads,) = execute_one(con, "SELECT current_setting('threads')").fetchone()

    def read(job: tuple[str, str]) -> None:
        cur = con.cursor()  # one connection per reader: DuckDB runs each on its own thread
        try:
            execute_one(cur, f"CREATE TABLE {job[0]} AS {job[1]}")
        finally:
            cur.close()

    if small:
        execute_one(con, "SET threads = 1")
    try:
        if workers > 1:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(read, todo))
        else:
            for job in todo:
                read(job)
    finally:
        if small:
            execute_one(con, f"SET threads = {int(threads)}")
    out.update((name, f"SELECT * FROM {name}") for name, _ in todo)
    return out
