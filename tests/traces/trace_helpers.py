"""Helpers of the trace tests: real Kineto traces from tests/data/traces (HTA test data)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import duckdb
import pyarrow as pa
from tracealyze.analyzer.diagnosis.detectors.base import Context
from tracealyze.analyzer.ingest.read import read_trace
from tracealyze.analyzer.run.catalog import Run

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


def ctx_over(*tables: pa.Table) -> Context:
    """A detector context over ``tables`` alone: a run with no metadata whose connection
    has only the ``trace_events`` view."""
    run = Run(Path("."), {})
    run.con = con_over(*tables)
    return Context(run=run)


def X(cat: str, name: str, ts: float, dur: float, pid: int = 1, tid: int = 1, **args) -> dict:
    """A complete ('X') event."""
    ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        ev["args"] = {k.replace("_", " ") if k == "External_id" else k: v
                      for k, v in args.items()}
    return ev


ITEMS_PER_STEP = 3


def with_items(src: Path, dst: Path, per_step: int = ITEMS_PER_STEP) -> Path:
    """``src`` plus ``per_step`` loss.item() calls at the end of every ProfilerStep: the op,
    its _local_scalar_dense, the D2H copy (runtime call + GPU memcpy, same correlation) and
    the stream synchronize that blocks the host, as torch 2.x records them."""
    with gzip.open(src) as f:
        d = json.loads(f.read())
    events = d["traceEvents"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    corr = 9_000_000
    for s in steps:
        pid, tid = s["pid"], s["tid"]
        for i in range(per_step):
            t = s["ts"] + s["dur"] - 2000.0 * (i + 1)
            corr += 1
            events += [
                {"ph": "X", "cat": "cpu_op", "name": "aten::item", "pid": pid, "tid": tid,
                 "ts": t, "dur": 1500.0, "args": {"External id": corr}},
                {"ph": "X", "cat": "cpu_op", "name": "aten::_local_scalar_dense", "pid": pid,
                 "tid": tid, "ts": t + 1, "dur": 1490.0, "args": {"External id": corr}},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": pid,
                 "tid": tid, "ts": t + 5, "dur": 20.0, "args": {"correlation": corr}},
                {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)",
                 "pid": 0, "tid": 23, "ts": t + 1400, "dur": 3.0,
                 "args": {"device": 0, "stream": 23, "correlation": corr, "bytes": 4}},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize",
                 "pid": pid, "tid": tid, "ts": t + 30, "dur": 1450.0,
                 "args": {"correlation": corr + 500_000}},
            ]
    dst.write_text(json.dumps(d))
    return dst


def assert_same_rows(a: pa.Table, b: pa.Table) -> None:
    """The same rows, the args as the same JSON values (their text may spell a number or a
    character differently: the trace's own spelling, or orjson's)."""
    import json

    assert a.schema == b.schema and a.num_rows == b.num_rows
    for name in a.column_names:
        if name != "args":
            assert a[name].equals(b[name]), name
    x, y = a["args"].to_pylist(), b["args"].to_pylist()
    assert [None if v is None else json.loads(v) for v in x] == \
        [None if v is None else json.loads(v) for v in y]
