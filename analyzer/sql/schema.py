"""The analyzer's view of the run-directory format: ``tracealyze.format.schema`` (the one
definition), with string dictionaries shown as plain strings. No pyarrow at import time:
``tracealyze --help`` must start fast."""

from __future__ import annotations

from typing import Any

from tracealyze.format import schema as _fmt

SCHEMA_VERSION: int = _fmt.SCHEMA_VERSION
"""Newest run-directory format this analyzer understands."""

TABLES: dict[str, tuple[tuple[str, str], ...]] = {t: _fmt.view_columns(t) for t in _fmt.TABLES}
"""table -> ((column, logical type), ...) in view order (``rank`` first)."""

TABLE_NAMES: tuple[str, ...] = _fmt.TABLE_NAMES
DUCKDB_TYPES: dict[str, str] = _fmt.DUCKDB_TYPES


DERIVED: dict[str, str] = {"grads": "tensor_stats", "steps_shards": "steps",
                           "tensor_stats_shards": "tensor_stats"}
"""Views built from another table's files."""


def tables_named(sql: str, other_views: frozenset[str] = frozenset()) -> set[str] | None:
    """The run tables whose files ``sql`` reads (DuckDB's own parser; derived views map
    to their table; ``other_views`` are views that are not run tables, left out), or None
    when it cannot tell or names something else (then every table is read, and the
    query's own error, if any, is the one the user sees)."""
    import duckdb

    con = duckdb.connect(":memory:")
    try:
        # Binding is not always side-effect free: get_table_names of an EXPORT DATABASE
        # creates its folder. Only a read is bound, on a connection that can touch no file.
        con.execute("SET enable_external_access = false")
        kinds = [str(s.type).rsplit(".", 1)[-1] for s in con.extract_statements(sql)]
        if kinds not in (["SELECT"], ["EXPLAIN"]):
            return None
        names = {n.rsplit(".", 1)[-1] for n in con.get_table_names(sql)}
    except duckdb.Error:
        return None
    finally:
        con.close()
    out = {DERIVED.get(n, n) for n in names - other_views}
    return out if out <= set(TABLE_NAMES) else None


def columns(table: str) -> list[str]:
    """Column names of ``table`` in view order."""
    return [name for name, _ in TABLES[table]]


def arrow_schema(table: str) -> Any:
    """The pyarrow.Schema of ``table``'s view, ``rank`` included (plain strings)."""
    import pyarrow as pa

    arrow = {"int32": pa.int32(), "int64": pa.int64(), "float32": pa.float32(),
             "float64": pa.float64(), "string": pa.string(), "bool": pa.bool_(),
             "int64[]": pa.list_(pa.int64())}
    return pa.schema([pa.field(name, arrow[typ]) for name, typ in TABLES[table]])
