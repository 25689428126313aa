"""Where a preset's cost goes on CUDA: the median step time (host part and wall) of short
segments of GPT-2 small (or another benchmarks/workloads.py workload), bare and under
presets with pieces turned off, each after its own warm-up. Run from the repository root:

    python tools/gpu/prof.py cuda gpt2 "bare,standard,debug,debug hist=0"

One segment per configuration: a first look at where the time goes, not a figure to
report (benchmarks/overhead.py is, median of rounds).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from typing import Any

import torch

sys.path.insert(0, "benchmarks")  # (the workloads the overhead benchmark uses)
from tracealyze.recorder import Recorder
from workloads import WORKLOADS, build

CONFIGS: dict[str, dict[str, Any] | None] = {
    "bare": None,
    "standard": {"preset": "standard"},
    "standard mem_every=0": {"preset": "standard", "memory_every": 0},
    "standard gn_every=0": {"preset": "standard", "grad_norm_every": 0},
    "debug": {"preset": "debug"},
    "debug hist=0": {"preset": "debug", "memory_history": 0},
    "debug hist=start": {"preset": "debug", "memory_history_at": 0.0},
    "debug act_nf=0": {"preset": "debug", "activation_nonfinite": False},
    "debug guard=0": {"preset": "debug", "zero_nonfinite_grads": False},
}


def main() -> None:
    dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    wl = sys.argv[2] if len(sys.argv) > 2 else "gpt2"
    want = sys.argv[3].split(",") if len(sys.argv) > 3 else list(CONFIGS)
    warm, measured = (15, 30) if dev == "cuda" else (3, 4)
    torch.set_float32_matmul_precision("high")
    torch.manual_seed(0)
    model, opt = build(wl, 0, dev)
    _, make, lossf = WORKLOADS[wl]
    x, y = (t.to(dev) for t in make(torch.Generator().manual_seed(0)))
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

    def segment(knobs: dict[str, Any] | None) -> tuple[float, float]:
        rec = None if knobs is None else Recorder(
            tempfile.mkdtemp() + "/r", model=model, optimizer=opt, profile_start=10**8,
            **knobs)
        host, wall = [], []
        for i in range(warm + measured):
            sync()
            t0 = time.perf_counter()
            loss = lossf(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if rec is not None:
                rec.step(loss=loss)
            t1 = time.perf_counter()
            sync()
            if i >= warm:
                host.append(t1 - t0)
                wall.append(time.perf_counter() - t0)
        if rec is not None:
            rec.close()
        return statistics.median(host) * 1e3, statistics.median(wall) * 1e3

    segment(None)  # (CUDA and cuBLAS warm-up)
    for name in want:
        try:
            h, w = segment(CONFIGS[name])
            print(f"{name:24s} host {h:7.2f} ms  wall {w:7.2f} ms", flush=True)
        except Exception as exc:
            print(f"{name:24s} failed: {exc!r}"[:300], flush=True)


if __name__ == "__main__":
    main()
