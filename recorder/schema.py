"""Arrow schemas of the tables the recorder writes (docs/FORMAT.md, schema_version 1)."""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 1

_F32 = pa.float32()
_F64 = pa.float64()
_I64 = pa.int64()
_I32 = pa.int32()
_STR = pa.string()

TABLES: dict[str, pa.Schema] = {
    "steps": pa.schema([
        ("rank", _I32), ("step", _I64), ("time", _F64), ("duration_s", _F64),
        ("data_wait_s", _F64), ("loss", _F64), ("lr", _F64), ("grad_norm", _F64),
        ("nonfinite_grads", _I32), ("loss_scale", _F64), ("amp_skipped", pa.bool_()),
    ]),
    "tensor_stats": pa.schema([
        ("rank", _I32), ("step", _I64), ("name", pa.dictionary(_I32, _STR)),
        ("kind", pa.dictionary(pa.int8(), _STR)), ("numel", _I64), ("norm", _F32),
        ("absmax", _F32), ("mean", _F32), ("std", _F32), ("min", _F32), ("max", _F32),
        ("zero_frac", _F32), ("nonfinite", _I64), ("ratio", _F32), ("seq", _I32),
    ]),
    "metrics": pa.schema([
        ("rank", _I32), ("step", _I64), ("name", pa.dictionary(_I32, _STR)), ("value", _F64),
    ]),
    "events": pa.schema([
        ("rank", _I32), ("step", _I64), ("time", _F64), ("kind", _STR), ("severity", _STR),
        ("subject", _STR), ("message", _STR), ("stack", _STR), ("details", _STR),
    ]),
    "memory": pa.schema([
        ("rank", _I32), ("step", _I64), ("time", _F64), ("rss_bytes", _I64),
        ("cuda_allocated_bytes", _I64), ("cuda_reserved_bytes", _I64),
        ("cuda_peak_bytes", _I64), ("cuda_alloc_retries", _I64), ("cuda_ooms", _I64),
        ("cuda_total_bytes", _I64),
    ]),
    "system": pa.schema([
        ("rank", _I32), ("time", _F64), ("cpu_percent", _F32), ("proc_cpu_percent", _F32),
        ("mem_percent", _F32), ("gpu_util", _F32),
    ]),
}

# Statistic columns of tensor_stats, in the order stats.py produces them.
STAT_COLUMNS: tuple[str, ...] = (
    "norm", "absmax", "mean", "std", "min", "max", "zero_frac", "nonfinite",
)
