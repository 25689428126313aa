"""On-disk bytes per recorded statistic value, and writer throughput.

Feeds the recorder's real writer path (StepItem -> Writer -> Parquet parts -> merge) with
per-step gradient-norm vectors and periodic full statistics shaped like a real run
(per-tensor log-normal scales drifting as a random walk, as gradient norms do), then
measures the run directory. Also writes the same scalars with TensorBoard's SummaryWriter
(if installed) for comparison.

    python benchmarks/storage.py                    # 200 tensors x 5000 steps
    python benchmarks/storage.py --tensors 200 --steps 20000 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from tracealyze.recorder.capture import Piece
from tracealyze.recorder.write.rows import StepItem
from tracealyze.recorder.write.writer import Writer, merge_parts


def synthetic_values(tensors: int, steps: int, seed: int = 0) -> np.ndarray:
    """[steps, tensors] float32 grad norms: per-tensor scale x slow random walk x noise."""
    rng = np.random.default_rng(seed)
    scale = np.exp(rng.normal(-3, 1.5, tensors))
    walk = np.cumsum(rng.normal(0, 0.01, (steps, tensors)), axis=0)
    noise = rng.normal(0, 0.1, (steps, tensors))
    return (scale * np.exp(walk + noise)).astype(np.float32)


def run_once(out: Path, tensors: int, steps: int, full_every: int) -> dict:
    names = tuple(f"layers.{i // 2}.{'weight' if i % 2 == 0 else 'bias'}"
                  for i in range(tensors))
    numels = tuple(16384 if i % 2 == 0 else 128 for i in range(tensors))
    vals = synthetic_values(tensors, steps)
    rng = np.random.default_rng(1)
    items = []
    n_values = 0
    for s in range(steps):
        pieces = [Piece("grad_norms", tensors, names)]
        vec = [vals[s]]
        n_values += tensors + 2  # per-tensor norms, plus loss and total grad norm
        if full_every and s % full_every == 0:
            full = np.column_stack([vals[s], vals[s] * 4, rng.normal(0, 1e-4, tensors),
                                    vals[s] / 128, -vals[s] * 4, vals[s] * 4,
                                    np.zeros(tensors), np.zeros(tensors)]).astype(np.float32)
            pieces.append(Piece("grad", tensors * 8, names, numels))
            vec.append(full.reshape(-1))
            n_values += tensors * 8
        pieces.append(Piece("loss", 1))
        vec.append(np.array([2.0 + np.exp(-s / 1000)], np.float32))
        items.append(StepItem(
            step=s, time=1.7e9 + s * 0.05, duration_s=0.05, data_wait_s=0.001, floats={},
            metrics={}, pieces=pieces, host=torch.from_numpy(np.concatenate(vec)), event=None,
            scaler=False, memory=False, probe=None, rss=None, nonfinite_state={}))
    run = out / "run"
    w = Writer(run, 0, flush_interval_s=1e9, flush_rows=10**9, queue_size=10**7,
               max_buffered_rows=10**9)
    w.close()  # use the writer's functions on this thread: measure CPU, not scheduling
    t0 = time.perf_counter()
    chunk = 2000
    batch = w.wake_every  # what the writer thread finds queued when submit() wakes it
    for i in range(0, len(items), batch):
        StepItem.write_many(w, items[i:i + batch])
        if (i + batch) % chunk == 0:  # ~a flush every 10 s at 200 steps/s
            w.flush()
    w.flush()
    t_write = time.perf_counter() - t0
    t1 = time.perf_counter()
    merge_parts(run, 0)
    t_merge = time.perf_counter() - t1
    files = list(run.rglob("*.parquet"))
    size = sum(p.stat().st_size for p in files)
    ts = [p for p in files if p.parts[-3] == "tensor_stats"]
    non_null = sum(
        sum(pq.read_table(p, columns=[c]).column(c).drop_null().__len__()
            for c in ("norm", "absmax", "mean", "std", "min", "max", "zero_frac", "nonfinite"))
        for p in ts)
    return {"values": n_values, "stat_values_in_files": non_null, "bytes": size,
            "bytes_per_value": size / n_values, "write_s": t_write, "merge_s": t_merge,
            "values_per_s": n_values / t_write}


def tensorboard_bytes(tensors: int, steps: int, out: Path) -> float | None:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:
        return None
    vals = synthetic_values(tensors, steps)
    w = SummaryWriter(str(out / "tb"))
    for s in range(steps):
        for i in range(tensors):
            w.add_scalar(f"grad_norm/t{i}", float(vals[s, i]), s)
    w.close()
    size = sum(p.stat().st_size for p in (out / "tb").rglob("*") if p.is_file())
    return size / (tensors * steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=200)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--full-every", type=int, default=100,
                    help="full statistics cadence, as in the standard preset")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tb-steps", type=int, default=500,
                    help="steps written through TensorBoard for comparison (0 = skip)")
    args = ap.parse_args()
    runs = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as d:
            runs.append(run_once(Path(d), args.tensors, args.steps, args.full_every))
    r0 = runs[0]
    bpv = [r["bytes_per_value"] for r in runs]
    vps = [r["values_per_s"] for r in runs]
    print(f"{args.tensors} tensors x {args.steps} steps, full stats every "
          f"{args.full_every}: {r0['values']:,} values, {r0['bytes']:,} bytes on disk")
    print(f"bytes per value: median {statistics.median(bpv):.3f} "
          f"(min {min(bpv):.3f}, max {max(bpv):.3f})")
    print(f"writer throughput: median {statistics.median(vps) / 1e6:.2f} M values/s "
          f"(min {min(vps) / 1e6:.2f}, max {max(vps) / 1e6:.2f}); "
          f"merge at close {statistics.median(r['merge_s'] for r in runs):.2f} s")
    if args.tb_steps:
        with tempfile.TemporaryDirectory() as d:
            tb = tensorboard_bytes(args.tensors, args.tb_steps, Path(d))
        if tb is not None:
            print(f"TensorBoard event file, same values: {tb:.1f} bytes per scalar")


if __name__ == "__main__":
    main()
