"""SQL built from a stranger's run directory, made safe in depth (docs/ANALYZER.md, "Untrusted
run directories").

A run directory is data. Column names come from Parquet footers, paths from directory
listings, run ids from run.json: none of it may become SQL. Three layers, each enough alone
against the known attacks:

1. **Quoting.** A name is always an identifier quoted by doubling ``"`` (:func:`ident`), a
   value always a literal quoted by doubling ``'`` (:func:`literal`); names never pass through
   ``str.format`` (a column called ``{rank}`` stays a column called ``{rank}``).
2. **One statement.** Every statement that carries data-derived text runs through
   :func:`execute_one`, which parses it first and refuses anything but exactly one statement:
   a ``"; COPY ... TO ...`` smuggled past layer 1 would be a second statement.
3. **A sandboxed connection** (:func:`sandbox`, :func:`lock`): DuckDB may open files only in
   the run directories of the command (``allowed_directories`` with
   ``enable_external_access = false``); extensions are never installed or loaded
   automatically; once the views exist the configuration is locked, so SQL cannot undo this.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from ..errors import QueryError, RunDirError, one_line
from .schema import TABLE_NAMES

_SPILL_DIR: str | None = None

READ_STATEMENTS = frozenset({"SELECT", "EXPLAIN"})
"""Statement types a user's ``query`` may run, by allow-list (an EXPLAIN only of a SELECT:
:func:`check_user_sql`)."""


def ident(name: str) -> str:
    """``name`` as a DuckDB identifier: double quotes, an inner ``"`` doubled (NUL, newlines
    and 1 MB names included: tested)."""
    return '"' + name.replace('"', '""') + '"'


def literal(value: str) -> str:
    """``value`` as a DuckDB string literal: single quotes, an inner ``'`` doubled."""
    return "'" + value.replace("'", "''") + "'"


def statement_count(con: Any, sql: str) -> int:
    """How many statements DuckDB's parser finds in ``sql``."""
    return len(con.extract_statements(sql))


def one_statement(con: Any, sql: str) -> str:
    """``sql`` if it is exactly one statement (the parser's word, not ours); RunDirError
    otherwise. For every statement that carries text read from a run directory."""
    import duckdb

    try:
        n = statement_count(con, sql)
    except duckdb.Error as e:
        raise RunDirError(f"cannot open the run's tables: {one_line(e)[:300]}") from e
    if n != 1:
        raise RunDirError(f"refusing SQL built from the run's files: {n} statements where "
                          "one was built (a crafted column or file name?)")
    return sql


def execute_one(con: Any, sql: str) -> Any:
    """Run ``sql`` once :func:`one_statement` has passed it."""
    return con.execute(one_statement(con, sql))


def spill_dir() -> str:
    """A private directory (mode 0700, removed at exit) for DuckDB's spill files: never the
    run we only read, and not the shared temp dir that a user's SQL could then list."""
    global _SPILL_DIR
    if _SPILL_DIR is None or not os.path.isdir(_SPILL_DIR):
        _SPILL_DIR = tempfile.mkdtemp(prefix="tracealyze-spill-")
        atexit.register(shutil.rmtree, _SPILL_DIR, True)
    return _SPILL_DIR


def sandbox(con: Any, allowed: Iterable[str | Path], *, allow_files: bool = False,
            temp_dir: str | Path | None = None, prefixes: Iterable[str] = ()) -> None:
    """Restrict ``con`` to reading ``allowed`` directories (and its spill dir: ``temp_dir``,
    by default a private one) and ``prefixes`` (``tzstore://<run>/``: the parts of a run in
    object storage, read in place); no extension is installed or loaded behind the user's back.
    ``allow_files=True`` (``query --allow-files``) keeps external access on: the user's own
    SQL may then read any file the user can."""
    dirs = sorted({str(Path(p).resolve()) for p in allowed})
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute(f"SET temp_directory = {literal(str(temp_dir or spill_dir()))}")
    if not allow_files:
        listed = ", ".join([*(literal(d.rstrip(os.sep) + os.sep) for d in dirs),
                            *(literal(p) for p in prefixes)])
        con.execute(f"SET allowed_directories = [{listed}]")
        con.execute("SET enable_external_access = false")


def lock(con: Any) -> None:
    """Freeze ``con``'s configuration: a ``SET`` in a user's query can no longer undo the
    sandbox."""
    con.execute("SET lock_configuration = true")


def _kind(statement: Any) -> str:
    return str(statement.type).rsplit(".", 1)[-1]


def _explained(sql: str) -> str | None:
    """The statement an ``EXPLAIN [ANALYZE] [(options)]`` explains, as text (DuckDB's own
    tokens find where it starts); None if ``sql`` does not have that shape."""
    import duckdb

    toks = duckdb.tokenize(sql)
    words = [(pos, sql[pos:toks[i + 1][0] if i + 1 < len(toks) else len(sql)].strip())
             for i, (pos, kind) in enumerate(toks) if kind != duckdb.token_type.comment]
    if not words or words[0][1].upper() != "EXPLAIN":
        return None
    i = 1
    if i < len(words) and words[i][1].upper() in ("ANALYZE", "ANALYSE"):
        i += 1
    if i < len(words) and words[i][1].startswith("("):  # EXPLAIN (FORMAT json) ...
        depth = 0
        while i < len(words):
            depth += words[i][1].count("(") - words[i][1].count(")")
            i += 1
            if depth <= 0:
                break
    return sql[words[i][0]:] if i < len(words) else None


def check_user_sql(con: Any, sql: str,
                   allowed_kinds: AbstractSet[str] = READ_STATEMENTS) -> None:
    """QueryError unless ``sql`` is exactly one read, by allow-list, on DuckDB's own parse:
    a ``SELECT`` (which is also what ``WITH``, ``DESCRIBE``, ``SUMMARIZE``, ``SHOW``,
    ``VALUES`` and ``FROM``-first queries parse to), or an ``EXPLAIN`` (``ANALYZE`` runs it)
    whose explained statement is itself one ``SELECT``. Everything else (``COPY … TO``,
    ``EXPORT``, ``ATTACH``, ``INSTALL``, ``LOAD``, ``CALL``, ``PRAGMA``, ``SET``, DDL, DML,
    a ``PIVOT`` statement that creates types first) is refused here, before it reaches a
    connection, whatever ``--allow-files`` says: that flag lets SQL read files, never write.
    ``allowed_kinds`` may only narrow the allow-list (``{"SELECT"}`` for a predicate)."""
    import duckdb

    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryError(one_line(e)) from e
    if len(statements) != 1:
        raise QueryError(f"expected one SQL statement, got {len(statements)}")
    kind = _kind(statements[0])
    if kind == "EXPLAIN" and "EXPLAIN" in allowed_kinds & READ_STATEMENTS:
        inner = _explained(sql)
        try:
            inner_kinds = [_kind(s) for s in con.extract_statements(inner)] if inner else []
        except duckdb.Error:
            inner_kinds = []
        if inner_kinds == ["SELECT"]:
            return
        raise QueryError("EXPLAIN is allowed only of one SELECT statement: the analyzer "
                         "never writes")
    if kind not in allowed_kinds & READ_STATEMENTS or kind == "EXPLAIN":
        # (a PIVOT without its values first creates a type from them: name them)
        hint = " (a PIVOT: give its values, PIVOT ... ON col IN (...))" if kind == "MULTI" \
            else ""
        raise QueryError(f"only read statements (SELECT, WITH, DESCRIBE, SUMMARIZE, EXPLAIN "
                         f"SELECT) are allowed, not {kind}: the analyzer never writes{hint}")


def read_query(con: Any, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one read-only SQL statement over ``con``: ``(column names, rows)``; QueryError
    on failure or on anything but a read."""

    def run() -> tuple[list[str], list[tuple[Any, ...]]]:
        rel = con.execute(sql)
        rows = rel.fetchall()
        return ([d[0] for d in rel.description] if rel.description else []), rows

    return _read(con, sql, run)


def read_arrow(con: Any, sql: str) -> Any:
    """:func:`read_query`'s result as a ``pyarrow.Table`` (for pandas, polars, a notebook);
    the same checks and errors."""

    def run() -> Any:
        rel = con.sql(sql)  # (a relation: Arrow without the DB-API result's extra copy)
        # (duckdb 2 names it to_arrow_table; 1.x arrow)
        return (getattr(rel, "to_arrow_table", None) or rel.arrow)()

    return _read(con, sql, run)


def _read(con: Any, sql: str, run: Any) -> Any:
    """``run()`` once ``sql`` is checked to be one read (QueryError otherwise, or when it
    fails; a missing table's message lists the tables there are)."""
    import duckdb

    check_user_sql(con, sql, READ_STATEMENTS)
    try:
        return run()
    except duckdb.Error as e:
        msg = one_line(e)
        if "does not exist" in msg and ("Table" in msg or "table" in msg):
            msg += f" (tables: {', '.join(TABLE_NAMES)})"
        raise QueryError(msg) from e
