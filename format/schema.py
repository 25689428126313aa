"""Table schemas of the run directory (docs/FORMAT.md), schema_version 2.

Version 2 keeps ``rank`` out of the Parquet files: it is the hive partition of the folder
``<table>/rank=<r>/``, so every Parquet reader (pandas, pyarrow datasets, polars, DuckDB,
Spark) gets it from the path with its own inferred type. Version 1 files also held a
``rank int32`` column, which clashed with the partition in those readers; the analyzer still
reads them (the folder's rank wins).
"""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION: int = 2
"""Version written by this code. Readers accept every version up to this one."""

OLDEST_READABLE: int = 1

# View order; ``rank`` (first) is the partition, not a column of the files.
TABLES: dict[str, tuple[tuple[str, str], ...]] = {
    "steps": (
        ("rank", "int32"), ("step", "int64"), ("time", "float64"), ("duration_s", "float64"),
        ("data_wait_s", "float64"), ("loss", "float64"), ("lr", "float64"),
        ("grad_norm", "float64"), ("nonfinite_grads", "int32"), ("loss_scale", "float64"),
        ("amp_skipped", "bool"), ("grad_clip_max", "float64"), ("compute_s", "float64"),
        ("samples_per_s", "float64"), ("tokens_per_s", "float64"), ("flops", "float64"),
        ("mfu", "float64"), ("sample_ids", "int64[]"), ("cpu_s", "float64"),
        ("cpu_queue_s", "float64"), ("new_shapes", "int32"),
    ),
    "tensor_stats": (
        ("rank", "int32"), ("step", "int64"), ("name", "dict32"), ("kind", "dict8"),
        ("numel", "int64"), ("norm", "float32"), ("absmax", "float32"), ("mean", "float32"),
        ("std", "float32"), ("min", "float32"), ("max", "float32"), ("zero_frac", "float32"),
        ("nonfinite", "int64"), ("ratio", "float32"), ("seq", "int32"),
        ("sat_frac", "float32"),
    ),
    "metrics": (
        ("rank", "int32"), ("step", "int64"), ("name", "dict32"), ("value", "float64"),
    ),
    "histograms": (
        ("rank", "int32"), ("step", "int64"), ("name", "dict32"), ("kind", "dict8"),
        ("numel", "int64"), ("nonfinite", "int64"), ("counts", "int64[]"),
    ),
    "events": (
        ("rank", "int32"), ("step", "int64"), ("time", "float64"), ("kind", "string"),
        ("severity", "string"), ("subject", "string"), ("message", "string"),
        ("stack", "string"), ("details", "string"),
    ),
    "memory": (
        ("rank", "int32"), ("step", "int64"), ("time", "float64"), ("rss_bytes", "int64"),
        ("cuda_allocated_bytes", "int64"), ("cuda_reserved_bytes", "int64"),
        ("cuda_peak_bytes", "int64"), ("cuda_alloc_retries", "int64"), ("cuda_ooms", "int64"),
        ("cuda_total_bytes", "int64"), ("heap_bytes", "int64"),
        ("cuda_max_allocated_bytes", "int64"), ("recorder_heap_bytes", "int64"),
    ),
    "system": (
        ("rank", "int32"), ("time", "float64"), ("cpu_percent", "float32"),
        ("proc_cpu_percent", "float32"), ("mem_percent", "float32"), ("gpu_util", "float32"),
    ),
    "trace_events": (
        ("rank", "int32"), ("trace_id", "string"), ("step", "int64"), ("cat", "string"),
        ("name", "string"), ("ts_us", "float64"), ("dur_us", "float64"), ("pid", "int64"),
        ("tid", "int64"), ("stream", "int64"), ("correlation", "int64"),
        ("external_id", "int64"), ("device", "int64"), ("args", "string"),
    ),
}
"""table -> ((column, type), ...); ``dict32``/``dict8`` are strings stored as Arrow
dictionaries (names that repeat every step)."""

TABLE_NAMES: tuple[str, ...] = tuple(TABLES)
RECORDER_TABLES: tuple[str, ...] = tuple(t for t in TABLES if t != "trace_events")
"""Tables the recorder writes (trace_events comes from import-trace)."""

PARTITION: str = "rank"

STAT_COLUMNS: tuple[str, ...] = (
    "norm", "absmax", "mean", "std", "min", "max", "zero_frac", "nonfinite",
)
"""Statistic columns of tensor_stats, in the order the recorder computes them."""

LOGICAL: dict[str, str] = {"dict32": "string", "dict8": "string"}

DUCKDB_TYPES: dict[str, str] = {
    "int32": "INTEGER", "int64": "BIGINT", "float32": "FLOAT", "float64": "DOUBLE",
    "string": "VARCHAR", "bool": "BOOLEAN", "int64[]": "BIGINT[]",
}


def logical(typ: str) -> str:
    """The logical type (int32, int64, float32, float64, string, bool, int64[]) of a column
    type."""
    return LOGICAL.get(typ, typ)


def columns(table: str, *, with_rank: bool = True) -> list[str]:
    """Column names of ``table`` in view order (``with_rank=False``: as stored in files)."""
    return [c for c, _ in TABLES[table] if with_rank or c != PARTITION]


def view_columns(table: str) -> tuple[tuple[str, str], ...]:
    """((column, logical type), ...) of the analyzer's view of ``table``."""
    return tuple((c, logical(t)) for c, t in TABLES[table])


def arrow_schema(table: str, *, with_rank: bool = False) -> Any:
    """The pyarrow.Schema of ``table``'s Parquet files (pyarrow imported here)."""
    import pyarrow as pa

    types = {
        "int32": pa.int32(), "int64": pa.int64(), "float32": pa.float32(),
        "float64": pa.float64(), "string": pa.string(), "bool": pa.bool_(),
        "dict32": pa.dictionary(pa.int32(), pa.string()),
        "dict8": pa.dictionary(pa.int8(), pa.string()),
        "int64[]": pa.list_(pa.int64()),
    }
    return pa.schema([pa.field(c, types[t]) for c, t in TABLES[table]
                      if with_rank or c != PARTITION])
