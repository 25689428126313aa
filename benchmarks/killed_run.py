"""Killed-run benchmark: `tracealyze summary` of a run killed after N flushes.

A run is recorded through the real writer (one part per table per flush: steps, tensor_stats
with 32 per-step grad-norm rows, memory) and "killed": never closed, so nothing is merged at
close. Before the writer compacted as it goes, such a run kept one file per flush (20,000
parts: summary 26.5 s). Prints the file count and the summary time (median of --repeats runs
of build_summary, plus the whole CLI process once), with and without compaction.

    python benchmarks/killed_run.py                  # 20,000 parts, fanout 16 vs none
    python benchmarks/killed_run.py --flushes 2000 --repeats 3
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TENSORS = 32


def record_killed(run_dir: Path, flushes: int, fanout: int) -> float:
    from tracealyze.format.parts import write_json_atomic
    from tracealyze.format.runmeta import new_rank_meta, new_run_meta
    from tracealyze.recorder.write.writer import Writer

    meta = new_run_meta(preset="standard", knobs={}, world_size=1, flush_interval_s=10.0)
    meta["heartbeat"] = meta["started"] = time.time() - 3600  # killed an hour ago
    write_json_atomic(run_dir / "run.json", meta)
    rank = new_rank_meta(0)
    rank["heartbeat"] = meta["heartbeat"]
    write_json_atomic(run_dir / "ranks" / "rank=0.json", rank)
    w = Writer(run_dir, 0, flush_interval_s=3600.0, flush_rows=10**9, queue_size=10,
               max_buffered_rows=10**9, compact_fanout=fanout)
    names = tuple(f"layer{i}.weight" for i in range(TENSORS))
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    for s in range(flushes):
        now = time.time()
        w.append("steps", {"step": np.array([s]), "time": np.array([now]),
                           "duration_s": np.array([0.1]), "loss": np.array([2.0 / (1 + s)]),
                           "grad_norm": np.array([1.0])})
        w.append("tensor_stats", {"step": np.full(TENSORS, s), "name": list(names),
                                  "kind": ["grad"] * TENSORS,
                                  "norm": rng.random(TENSORS).astype(np.float32)})
        w.append("memory", {"step": np.array([s]), "time": np.array([now]),
                            "rss_bytes": np.array([1_500_000_000])})
        w.flush()
    elapsed = time.perf_counter() - t0
    # killed: the writer thread is stopped without a close (no merge, no final status)
    w._stopping.set()
    w._wake.set()
    w._thread.join(5)
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flushes", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fanouts", default="16,0", help="compaction fanouts; 0 = none")
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    from tracealyze.analyzer.diagnosis.summary import build_summary

    root = args.dir or Path(tempfile.mkdtemp(prefix="tracealyze-killed-"))
    for fanout in (int(f) for f in args.fanouts.split(",")):
        run = root / f"fanout{fanout}"
        shutil.rmtree(run, ignore_errors=True)
        rec_s = record_killed(run, args.flushes, fanout)
        files = sum(1 for _ in run.rglob("part-*.parquet"))
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            s = build_summary(run)
            times.append(time.perf_counter() - t0)
        assert s["run"]["steps"] == args.flushes and s["run"]["killed"], s["run"]
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tracealyze.analyzer.cli", "summary", str(run)],
                       check=False, capture_output=True)
        cli = time.perf_counter() - t0
        print(f"fanout {fanout:>2}: {args.flushes:,} flushes recorded in {rec_s:.1f} s, "
              f"{files:,} part files; summary median {statistics.median(times):.2f} s "
              f"(min {min(times):.2f}, max {max(times):.2f}, n={len(times)}); "
              f"CLI process {cli:.2f} s", flush=True)
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
