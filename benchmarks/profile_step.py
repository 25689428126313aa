"""Where the recorder's per-step cost goes on the training thread: step time of a bare loop
and of the same loop recorded (separate loops, after a warm-up past the profiler window),
then cProfile's top functions by own time over the recorded steps.

    python benchmarks/profile_step.py --device cuda --workload gpt --preset standard
    python benchmarks/profile_step.py --workload mlp --preset debug --steps 100

On CUDA each step ends with ``torch.cuda.synchronize()`` (the harness's, so that a step's
time is its GPU work too). A launch-bound model (the small GPT on a fast GPU) shows the
recorder's host-side cost one for one: the GPU waits on the host's launches.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tracealyze.recorder import Recorder
from workloads import WORKLOADS, build, timed_step


def _thread_cpu() -> dict[str, float]:
    """CPU seconds so far of each live thread, by name."""
    out: dict[str, float] = {}
    for t in threading.enumerate():
        try:
            clk = time.pthread_getcpuclockid(t.ident)
            out[f"{t.name}#{t.ident}"] = time.clock_gettime(clk)
        except (OSError, TypeError):
            pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="gpt", choices=sorted(WORKLOADS))
    ap.add_argument("--preset", default="standard")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.set_float32_matmul_precision("high")
    _, make_batch, loss_fn = WORKLOADS[args.workload]
    model, opt = build(args.workload, 0, args.device)
    g = torch.Generator().manual_seed(0)
    batches = [tuple(t.to(args.device) for t in make_batch(g)) for _ in range(8)]

    def loop(n: int, rec: Recorder | None, times: list[float]) -> None:
        for i in range(n):
            x, y = batches[i % len(batches)]
            times.append(timed_step(model, opt, loss_fn, x, y, rec, cuda))

    bare: list[float] = []
    loop(args.warmup, None, [])
    loop(args.steps, None, bare)
    recorded: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, Recorder(
            Path(tmp) / "run", model=model, optimizer=opt, preset=args.preset) as rec:
        loop(args.warmup, rec, [])
        cpu0 = _thread_cpu()
        prof = cProfile.Profile()
        prof.enable()
        loop(args.steps, rec, recorded)
        prof.disable()
        cpu1 = _thread_cpu()
    for name, t in sorted(cpu1.items(), key=lambda kv: -kv[1]):
        used = t - cpu0.get(name, 0.0)
        if used > 0:
            print(f"thread {name}: {used / args.steps * 1e3:.3f} ms CPU per step")
    b, r = statistics.median(bare), statistics.median(recorded)
    print(f"{args.workload} {args.preset} on {args.device}: bare {b * 1e3:.2f} ms, recorded "
          f"{r * 1e3:.2f} ms (under cProfile), +{(r - b) * 1e3:.2f} ms/step")
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(args.top)
    # the recorder's own functions (and the torch calls made inside them): cumulative
    import tracealyze.recorder as pkg

    mine = str(Path(pkg.__file__).parent.parent)
    stats.sort_stats("cumulative").print_stats(f"^{mine}/(recorder|format)/", args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
