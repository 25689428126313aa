"""Helpers of the trace tests: real Kineto traces from tests/data/traces (HTA test data)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import duckdb
import pyarrow as pa
from tracealyze.analyzer.traces import read_trace

DATA = Path(__file__).resolve().parent.parent / "data" / "traces"
NCCL_NS = DATA / "gpu_nccl_1rank_ns.pt.trace.json.gz"
SAMPLED = DATA / "gpu_sampled_rank0.json.gz"
ALEXNET = DATA / "gpu_alexnet_cuda_sync.json.gz"
CPU_ONLY = DATA / "cpu_only_rank34.pt.trace.json.gz"
ROCM = DATA / "amd_mi250_rocm.json.gz"
GPU_TRACES = [NCCL_NS, SAMPLED, ALEXNET, ROCM]

_cache: dict[Path, pa.Table] = {}


def table_of(path: Path) -> pa.Table:
    """read_trace, parsed once per session (the 68k-event trace takes a while)."""
    if path not in _cache:
        _cache[path] = read_trace(path)
    return _cache[path]


def con_over(*tables: pa.Table) -> duckdb.DuckDBPyConnection:
    """A plain duckdb connection with a ``trace_events`` view over ``tables``."""
    con = duckdb.connect()
    con.register("_te", pa.concat_tables(tables))
    con.execute("CREATE VIEW trace_events AS SELECT * FROM _te")
    return con


def ctx_over(*tables: pa.Table) -> SimpleNamespace:
    """Minimal detector context: ``ctx.con`` (what the detector protocol needs)."""
    return SimpleNamespace(con=con_over(*tables))


def X(cat: str, name: str, ts: float, dur: float, pid: int = 1, tid: int = 1, **args) -> dict:
    """A complete ('X') event."""
    ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        ev["args"] = {k.replace("_", " ") if k == "External_id" else k: v
                      for k, v in args.items()}
    return ev
