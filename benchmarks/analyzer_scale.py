"""Analyzer scale benchmark: time `tracealyze summary` on big synthetic runs.

Writes a run of STEPS × TENSORS tensor_stats rows (every step one grad-norm row per tensor,
as the standard preset's cheap per-step rows; every 100th step full grad/param/update
statistics), plus steps and memory, vectorised with pyarrow; then times build_summary (what
`tracealyze summary` runs, without process start-up) over a few repeats and reports median and
spread, for the requested size and for a second size (half the steps) to show the growth.

    python benchmarks/analyzer_scale.py                      # 100,000 × 200 and 50,000 × 200
    python benchmarks/analyzer_scale.py --steps 20000 --tensors 50 --repeats 3 --dir /tmp/b
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FULL_EVERY = 100
STEPS_PER_PART = 10_000  # like the recorder's merged parts: a few big files per table


def _write(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="zstd", use_dictionary=["name", "kind"],
                   row_group_size=1 << 20)


def write_run(run_dir: Path, steps: int, tensors: int, seed: int = 0) -> int:
    """Write the synthetic run; returns the number of tensor_stats rows."""
    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True)
    now = time.time()
    (run_dir / "run.json").write_text(json.dumps({
        "schema_version": 1, "run_id": uuid.uuid4().hex, "started": now - steps * 0.1,
        "ended": now, "status": "completed", "heartbeat": now, "flush_interval_s": 10.0,
        "world_size": 1, "counters": {"dropped": {}, "recorder_errors": 0}}))
    s = np.arange(steps, dtype=np.int64)
    dur = 0.1 * (1 + 0.02 * np.abs(rng.normal(0, 1, steps)))
    _write(pa.table({
        "rank": pa.array(np.zeros(steps, np.int32)), "step": s, "time": now + np.cumsum(dur),
        "duration_s": dur, "data_wait_s": 0.002 * (1 + np.abs(rng.normal(0, 1, steps))),
        "loss": 2 * np.exp(-s / steps * 3) + 0.3 + 0.01 * rng.normal(0, 1, steps),
        "lr": np.full(steps, 1e-3), "grad_norm": 1 + 0.05 * rng.normal(0, 1, steps),
        "nonfinite_grads": pa.array(np.zeros(steps, np.int32)),
    }), run_dir / "steps/rank=0/part-000001.parquet")
    _write(pa.table({
        "rank": pa.array(np.zeros(steps, np.int32)), "step": s, "time": now + np.cumsum(dur),
        "rss_bytes": (1.5e9 + 2e6 * rng.normal(0, 1, steps)).astype(np.int64),
    }), run_dir / "memory/rank=0/part-000001.parquet")
    names = np.array([f"model.layers.{i // 2}.{'weight' if i % 2 == 0 else 'bias'}"
                      for i in range(tensors)], dtype=object)
    base = 0.1 * (1 + 0.3 * (np.arange(tensors) % 5))
    rows = 0
    for part, a in enumerate(range(0, steps, STEPS_PER_PART), start=1):
        b = min(steps, a + STEPS_PER_PART)
        n = (b - a) * tensors
        step = np.repeat(s[a:b], tensors)
        name_idx = np.tile(np.arange(tensors, dtype=np.int32), b - a)
        norm = (np.tile(base, b - a) * (1 + 0.05 * rng.standard_normal(n))).astype(np.float32)
        cols = {
            "rank": pa.array(np.zeros(n, np.int32)), "step": step,
            "name": pa.DictionaryArray.from_arrays(pa.array(name_idx), pa.array(names)),
            "kind": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int8)),
                                                   pa.array(["grad"])),
            "numel": np.full(n, 4096, np.int64), "norm": norm,
        }
        tables = [pa.table(cols)]
        full = s[a:b][s[a:b] % FULL_EVERY == 0]
        for kind, scale in (("grad", base), ("param", np.full(tensors, 10.0)),
                            ("update", np.full(tensors, 1e-2))):
            m = len(full) * tensors
            v = (np.tile(scale, len(full)) * (1 + 0.05 * rng.standard_normal(m))
                 ).astype(np.float32)
            tables.append(pa.table({
                "rank": pa.array(np.zeros(m, np.int32)), "step": np.repeat(full, tensors),
                "name": pa.DictionaryArray.from_arrays(
                    pa.array(np.tile(np.arange(tensors, dtype=np.int32), len(full))),
                    pa.array(names)),
                "kind": pa.DictionaryArray.from_arrays(pa.array(np.zeros(m, np.int8)),
                                                       pa.array([kind])),
                "numel": np.full(m, 4096, np.int64), "norm": v,
                "std": v / 64, "zero_frac": np.zeros(m, np.float32),
                "nonfinite": np.zeros(m, np.int64),
                "ratio": (v / 10.0) if kind == "update" else pa.nulls(m, pa.float32()),
            }))
        table = pa.concat_tables(tables, promote_options="default")
        rows += table.num_rows
        _write(table, run_dir / f"tensor_stats/rank=0/part-{part:06d}.parquet")
    return rows


def time_summary(run_dir: Path, repeats: int) -> list[float]:
    from tracealyze.analyzer.diagnosis.summary import build_summary

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        summary = build_summary(run_dir)
        times.append(time.perf_counter() - t0)
    bad = [f["id"] for f in summary["findings"] if f["severity"] != "info"]
    if bad:
        print(f"  note: findings above info on a healthy synthetic run: {bad}")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--tensors", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp "
                    "dir, removed afterwards)")
    ap.add_argument("--no-second-size", action="store_true",
                    help="skip the half-size run used to show the growth")
    ap.add_argument("--trace", type=Path, default=None,
                    help="also put this raw profiler trace under the run's traces/rank=0/: "
                         "the first summary parses it (a cold cache, reported apart), the "
                         "others read its rows from the analyzer's trace cache")
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="tracealyze-scale-"))
    os.environ["TRACEALYZE_CACHE_DIR"] = str(root / "cache")  # cold at the start
    sizes = [args.steps] + ([] if args.no_second_size else [args.steps // 2])
    results = []
    try:
        for steps in sorted(sizes):
            run_dir = root / f"run-{steps}x{args.tensors}"
            if run_dir.exists():
                shutil.rmtree(run_dir)
            t0 = time.perf_counter()
            rows = write_run(run_dir, steps, args.tensors)
            wt = time.perf_counter() - t0
            mb = sum(p.stat().st_size for p in run_dir.rglob("*.parquet")) / 1e6
            print(f"{steps:,} steps × {args.tensors} tensors: {rows:,} tensor_stats rows, "
                  f"{mb:.0f} MB Parquet, written in {wt:.1f} s")
            if args.trace is not None:
                (run_dir / "traces" / "rank=0").mkdir(parents=True)
                shutil.copyfile(args.trace, run_dir / "traces" / "rank=0" / args.trace.name)
                cold = time_summary(run_dir, 1)[0]
                print(f"  summary with {args.trace.name} ({args.trace.stat().st_size / 1e3:.0f}"
                      f" KB), cold trace cache: {cold:.2f} s")
            times = time_summary(run_dir, args.repeats)
            med = statistics.median(times)
            results.append((steps, rows, med))
            print(f"  summary: median {med:.2f} s, min {min(times):.2f} s, max "
                  f"{max(times):.2f} s over {len(times)} runs "
                  f"({rows / med / 1e6:.1f} M rows/s)")
        if len(results) == 2:
            (_, r1, t1), (_, r2, t2) = results
            print(f"growth: {r2 / r1:.2f}× rows → {t2 / t1:.2f}× time "
                  f"(≤ {r2 / r1:.2f}× means no worse than linear)")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
