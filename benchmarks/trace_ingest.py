"""Trace-ingest benchmark: read_trace + gpu_time_breakdown on the 68,692-event Kineto trace.

    python benchmarks/trace_ingest.py [--repeats 7] [TRACE]

Prints the median and spread (min–max) over repeats of: parsing the trace into the
trace_events table, the GPU time breakdown over it (DuckDB), and both; and events/s (raw
trace events, all phases, per second of parse + breakdown). The first run is a warm-up
(imports, page cache) and is not counted.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import statistics
import time
from pathlib import Path

import duckdb
from tracealyze.analyzer.gputime import gpu_time_breakdown
from tracealyze.analyzer.traces import read_trace

DEFAULT = (Path(__file__).resolve().parent.parent / "tests" / "data" / "traces"
           / "gpu_nccl_1rank_ns.pt.trace.json.gz")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()

    raw_events = len(json.loads(gzip.decompress(a.trace.read_bytes()))["traceEvents"])
    parse_s, gpu_s = [], []
    rows = 0
    result = None
    for i in range(a.repeats + 1):
        t0 = time.perf_counter()
        table = read_trace(a.trace)
        t1 = time.perf_counter()
        con = duckdb.connect()
        con.register("trace_events", table)
        result = gpu_time_breakdown(con)
        t2 = time.perf_counter()
        con.close()
        rows = table.num_rows
        if i:  # warm-up excluded
            parse_s.append(t1 - t0)
            gpu_s.append(t2 - t1)
    both = [p + g for p, g in zip(parse_s, gpu_s, strict=True)]

    def fmt(xs: list[float]) -> str:
        return (f"median {statistics.median(xs) * 1e3:7.1f} ms  "
                f"(min {min(xs) * 1e3:.1f}, max {max(xs) * 1e3:.1f})")

    print(f"trace: {a.trace.name}: {raw_events:,} raw events -> {rows:,} trace_events rows")
    print(f"machine: {platform.processor() or platform.machine()}, python "
          f"{platform.python_version()}, duckdb {duckdb.__version__}, repeats {a.repeats}")
    print(f"read_trace          {fmt(parse_s)}")
    print(f"gpu_time_breakdown  {fmt(gpu_s)}")
    print(f"both                {fmt(both)}")
    print(f"throughput          {raw_events / statistics.median(both):,.0f} raw events/s")
    print(f"result              {result}")


if __name__ == "__main__":
    main()
