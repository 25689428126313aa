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


def columns(table: str) -> list[str]:
    """Column names of ``table`` in view order."""
    return [name for name, _ in TABLES[table]]


def arrow_schema(table: str) -> Any:
    """The pyarrow.Schema of ``table``'s view, ``rank`` included (plain strings)."""
    import pyarrow as pa

    arrow = {"int32": pa.int32(), "int64": pa.int64(), "float32": pa.float32(),
             "float64": pa.float64(), "string": pa.string(), "bool": pa.bool_()}
    return pa.schema([pa.field(name, arrow[typ]) for name, typ in TABLES[table]])
