"""The analyzer's own copy of the run-directory format (docs/FORMAT.md, schema_version 1).

The analyzer must not import the recorder (it imports torch), so the column lists live here
too; ``tests/test_format_contract.py`` checks both copies agree. Types are logical names
mapped to DuckDB and Arrow types on demand, so importing this module stays cheap (no pyarrow
at import time: ``tracealyze --help`` must start fast).
"""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION: int = 1
"""Newest run-directory format this analyzer understands."""

# Column order is the order the views expose; every table also has ``rank int32`` (first).
TABLES: dict[str, tuple[tuple[str, str], ...]] = {
    "steps": (
        ("rank", "int32"),
        ("step", "int64"),
        ("time", "float64"),
        ("duration_s", "float64"),
        ("data_wait_s", "float64"),
        ("loss", "float64"),
        ("lr", "float64"),
        ("grad_norm", "float64"),
        ("nonfinite_grads", "int32"),
        ("loss_scale", "float64"),
        ("amp_skipped", "bool"),
    ),
    "tensor_stats": (
        ("rank", "int32"),
        ("step", "int64"),
        ("name", "string"),
        ("kind", "string"),
        ("numel", "int64"),
        ("norm", "float32"),
        ("absmax", "float32"),
        ("mean", "float32"),
        ("std", "float32"),
        ("min", "float32"),
        ("max", "float32"),
        ("zero_frac", "float32"),
        ("nonfinite", "int64"),
        ("ratio", "float32"),
        ("seq", "int32"),
    ),
    "metrics": (
        ("rank", "int32"),
        ("step", "int64"),
        ("name", "string"),
        ("value", "float64"),
    ),
    "events": (
        ("rank", "int32"),
        ("step", "int64"),
        ("time", "float64"),
        ("kind", "string"),
        ("severity", "string"),
        ("subject", "string"),
        ("message", "string"),
        ("stack", "string"),
        ("details", "string"),
    ),
    "memory": (
        ("rank", "int32"),
        ("step", "int64"),
        ("time", "float64"),
        ("rss_bytes", "int64"),
        ("cuda_allocated_bytes", "int64"),
        ("cuda_reserved_bytes", "int64"),
        ("cuda_peak_bytes", "int64"),
        ("cuda_alloc_retries", "int64"),
        ("cuda_ooms", "int64"),
        ("cuda_total_bytes", "int64"),
    ),
    "system": (
        ("rank", "int32"),
        ("time", "float64"),
        ("cpu_percent", "float32"),
        ("proc_cpu_percent", "float32"),
        ("mem_percent", "float32"),
        ("gpu_util", "float32"),
    ),
    "trace_events": (
        ("rank", "int32"),
        ("trace_id", "string"),
        ("step", "int64"),
        ("cat", "string"),
        ("name", "string"),
        ("ts_us", "float64"),
        ("dur_us", "float64"),
        ("pid", "int64"),
        ("tid", "int64"),
        ("stream", "int64"),
        ("correlation", "int64"),
        ("external_id", "int64"),
        ("device", "int64"),
        ("args", "string"),
    ),
}
"""table -> ((column, logical type), ...) per docs/FORMAT.md."""

TABLE_NAMES: tuple[str, ...] = tuple(TABLES)

DUCKDB_TYPES: dict[str, str] = {
    "int32": "INTEGER",
    "int64": "BIGINT",
    "float32": "FLOAT",
    "float64": "DOUBLE",
    "string": "VARCHAR",
    "bool": "BOOLEAN",
}


def columns(table: str) -> list[str]:
    """Column names of ``table`` in view order."""
    return [name for name, _ in TABLES[table]]


def arrow_schema(table: str) -> Any:
    """The pyarrow.Schema of ``table`` (pyarrow imported here, not at module import)."""
    import pyarrow as pa

    arrow = {
        "int32": pa.int32(),
        "int64": pa.int64(),
        "float32": pa.float32(),
        "float64": pa.float64(),
        "string": pa.string(),
        "bool": pa.bool_(),
    }
    return pa.schema([pa.field(name, arrow[typ]) for name, typ in TABLES[table]])
