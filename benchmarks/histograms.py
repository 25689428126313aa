"""What a histogram step costs: ``Histograms.counts`` of every gradient and weight of a
benchmark workload (the recorder's work at each ``histogram_every`` step, on the training
thread), its cost spread over the cadence, and the bytes a histogram row takes on disk.

    python benchmarks/histograms.py                 # gpt and mlp on the CPU
    python benchmarks/histograms.py --device cuda --workload gpt2,gpt

Prints, per workload: the median (and min..max) wall time of one histogram step over
--repeats calls (on CUDA each ends with a synchronize: the kernels' time, not the launches'),
the median training step, and the histogram step's share of a step at the standard cadence
(every 100 steps); then the Parquet bytes per row of a short recorded run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from tracealyze.recorder import Recorder
from tracealyze.recorder.tensors.histogram import Histograms
from workloads import WORKLOADS, build, timed_step

CADENCE = 100  # the standard preset's histogram_every


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="gpt,mlp")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)  # (as the overhead benchmark: the recorder's spare core apart)
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for w in args.workload.split(","):
        model, opt = build(w, 0, args.device)
        _, make, loss_fn = WORKLOADS[w]
        x, y = (t.to(args.device) for t in make(torch.Generator().manual_seed(0)))
        steps = [timed_step(model, opt, loss_fn, x, y, None, cuda) for _ in range(8)][3:]
        params = [p.detach() for p in model.parameters()]
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        hist = Histograms()
        times = []
        for _ in range(args.repeats):
            sync()
            t0 = time.perf_counter()
            hist.counts(grads)
            hist.counts(params)
            sync()
            times.append(time.perf_counter() - t0)
        times = times[2:]  # (the first builds the plans)
        step = statistics.median(steps)
        h = statistics.median(times)
        n = sum(p.numel() for p in params)
        print(f"{w:5s} {len(params)} tensors, {n / 1e6:.1f}M elements: histogram step "
              f"{h * 1e3:.1f} ms ({min(times) * 1e3:.1f}..{max(times) * 1e3:.1f}), training "
              f"step {step * 1e3:.1f} ms: {100 * h / CADENCE / step:.2f}% of a step at every "
              f"{CADENCE}", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            with Recorder(Path(tmp) / "r", model=model, optimizer=opt, preset="minimal",
                          histogram_every=1, memory_every=0) as rec:
                for _ in range(20):
                    timed_step(model, opt, loss_fn, x, y, rec, cuda)
            files = list((Path(tmp) / "r" / "histograms").rglob("*.parquet"))
            size = sum(f.stat().st_size for f in files)
            rows = 20 * 2 * len(params)
            print(f"      histograms on disk: {size:,} bytes for {rows:,} rows: "
                  f"{size / rows:.0f} bytes a row ({size / rows / 113:.2f} a bin)", flush=True)


if __name__ == "__main__":
    main()
