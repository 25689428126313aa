"""Step-time overhead of the recorder, per preset, against the same loop without it.

Method (the machine is shared and noisy, so separate processes are not comparable):
two identical replicas of the model live in ONE process — same init, same batches — and
their steps are alternated (ABBA order). Replica B carries the logger under test; replica A
is bare. Per round, overhead = (median step time of B + CPU time the logger's own background
threads used, per step) / median step time of A − 1. "Paired" is the median over steps of
(B step / the A step interleaved with it) − 1, plus the same background charge: a slow spell
of the shared machine hits both steps of a pair, so it is the steadier figure when the
machine is noisy. The A/A configuration (both bare) shows the noise floor. Figures: median
and spread (min..max) over rounds; the mean-based
overhead (which includes the rare cadence steps: full statistics) is printed too.

The measured steps are the steady state, after --warmup steps (60) that hold each preset's
first torch.profiler window (standard: steps 49-52, debug: 19-22): a one-time cost that a
long run pays once, reported on its own as "one-time" (extra wall time of B over A during
the warm-up plus the background CPU spent then: the window's profiling, export and gzip).

    python benchmarks/overhead.py                       # both workloads, all configs
    python benchmarks/overhead.py --workload mlp --rounds 5 --steps 60
    python benchmarks/overhead.py --workload mlp --mlp-batch 720   # ~50 ms steps (2026-11-23)
    python benchmarks/overhead.py --device cuda --workload gpt2,gpt --configs aa,standard
    python benchmarks/overhead.py --workload mlp --configs standard,standard+histogram_every=0

On CUDA each timed step ends with ``torch.cuda.synchronize()`` (the harness's, so that a
step's time is its GPU work too; the recorder itself adds no sync) and matmuls use TF32.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tracealyze.recorder import Recorder
from workloads import WORKLOADS, build, timed_step


class HandRolledTB:
    """How users usually log per-parameter statistics: .item() per value, every step."""

    def __init__(self, logdir: str, model: torch.nn.Module) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.w = SummaryWriter(logdir)
        self.named = list(model.named_parameters())
        self.step_no = 0

    def step(self, loss: torch.Tensor) -> None:
        s = self.step_no
        self.w.add_scalar("loss", loss.item(), s)
        for n, p in self.named:
            g = p.grad
            if g is None:
                continue
            self.w.add_scalar(f"grad_norm/{n}", g.norm().item(), s)
            self.w.add_scalar(f"grad_absmax/{n}", g.abs().max().item(), s)
            self.w.add_scalar(f"grad_mean/{n}", g.mean().item(), s)
            self.w.add_scalar(f"grad_std/{n}", g.std().item(), s)
        self.step_no += 1

    def close(self) -> None:
        self.w.close()


def _thread_cpu(clocks: list[int]) -> float:
    """CPU seconds used so far by the threads whose CPU-time clocks these are
    (``pthread_getcpuclockid``: nanosecond resolution, unlike /proc's 10 ms ticks)."""
    total = 0.0
    for clk in clocks:
        try:
            total += time.clock_gettime(clk)
        except OSError:  # the thread has exited: its time is no longer counted
            pass
    return total


def one_round(workload: str, config: str, steps: int, warmup: int, seed: int,
              batch: int | None = None, device: str = "cpu") -> dict:
    _, make_batch, loss_fn = WORKLOADS[workload]
    if batch:
        make_batch = functools.partial(make_batch, batch=batch)
    model_a, opt_a = build(workload, seed, device)
    model_b, opt_b = build(workload, seed, device)
    cuda = device.startswith("cuda")
    before = {t.ident for t in threading.enumerate()}
    tmp = tempfile.mkdtemp(prefix=f"tz-bench-{workload}-{config}-")
    logger = None
    preset, *knobs = config.split("+")  # "standard+histogram_every=0": a preset's knob set
    if preset in ("minimal", "standard", "debug"):
        overrides = {k: ast.literal_eval(v) for k, v in (kv.split("=", 1) for kv in knobs)}
        logger = Recorder(Path(tmp) / "run", model=model_b, optimizer=opt_b, preset=preset,
                          **overrides)
    elif config == "tensorboard":
        logger = HandRolledTB(tmp, model_b)
    # The logger's own background threads (writer, sampler): their CPU is charged to it.
    bg_ids = [time.pthread_getcpuclockid(t.ident) for t in threading.enumerate()
              if t.ident not in before]
    g = torch.Generator().manual_seed(seed)
    batches = [tuple(t.to(device) for t in make_batch(g)) for _ in range(8)]

    def train_step(model, opt, x, y, log) -> float:
        return timed_step(model, opt, loss_fn, x, y, log, cuda)

    ta, tb = [], []
    cpu0 = 0.0
    warm_extra = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            cpu0 = _thread_cpu(bg_ids)
            warm_extra += cpu0  # background CPU during the warm-up
        x, y = batches[i % len(batches)]
        # ABBA: alternate which replica goes first, so cache/thermal order effects cancel.
        if i % 2 == 0:
            a = train_step(model_a, opt_a, x, y, None)
            b = train_step(model_b, opt_b, x, y, logger)
        else:
            b = train_step(model_b, opt_b, x, y, logger)
            a = train_step(model_a, opt_a, x, y, None)
        if i >= warmup:
            ta.append(a)
            tb.append(b)
        elif i > 0:  # step 0 carries one-time start-up costs of either replica
            warm_extra += b - a
    bg = _thread_cpu(bg_ids) - cpu0
    t_close = time.perf_counter()
    if logger is not None:
        logger.close()
    t_close = time.perf_counter() - t_close
    bg_per_step = bg / steps
    med_a, med_b = statistics.median(ta), statistics.median(tb)
    # Paired: each B step against the A step it was interleaved with, so that a slow spell
    # of the (shared) machine hits both sides of a pair and cancels out.
    paired = statistics.median(b / a for a, b in zip(ta, tb, strict=True))
    return {
        "paired_overhead": paired - 1 + bg_per_step / med_a,
        "median_overhead": (med_b + bg_per_step) / med_a - 1,
        "mean_overhead": (statistics.fmean(tb) + bg_per_step) / statistics.fmean(ta) - 1,
        "step_s": med_a, "bg_cpu_per_step_s": bg_per_step, "close_s": t_close,
        "one_time_s": warm_extra,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="all",
                    help="gpt, mlp, gpt2 (GPT-2 small's shape, for a GPU), comma-separated, "
                    "or all (gpt,mlp)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--configs", default="aa,minimal,standard,debug,tensorboard")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=0, help="measured steps per round "
                    "(default: 30 for gpt, 120 for mlp)")
    ap.add_argument("--warmup", type=int, default=60,
                    help="steps before measuring (default 60: past each preset's first "
                    "profiler window, whose one-time cost is reported separately)")
    ap.add_argument("--mlp-batch", type=int, default=0,
                    help="MLP batch size (default 320); the step time, and so the overhead "
                    "in percent, follows it: the issue's MLP is ~50 ms per step")
    ap.add_argument("--json", help="also write results to this JSON file")
    args = ap.parse_args()
    workloads = ["gpt", "mlp"] if args.workload == "all" else args.workload.split(",")
    if args.device.startswith("cuda"):
        torch.set_float32_matmul_precision("high")
        print(f"device {torch.cuda.get_device_name()}", flush=True)
    results = {}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{psutil.cpu_count()} CPUs", flush=True)
    for w in workloads:
        steps = args.steps or {"gpt": 30, "mlp": 120, "gpt2": 40}[w]
        for cfg in args.configs.split(","):
            rounds = [one_round(w, cfg, steps, args.warmup, seed=r,
                                batch=args.mlp_batch if w == "mlp" else None,
                                device=args.device)
                      for r in range(args.rounds)]
            med = [r["median_overhead"] * 100 for r in rounds]
            paired = [r["paired_overhead"] * 100 for r in rounds]
            mean = [r["mean_overhead"] * 100 for r in rounds]
            res = {
                "median_pct": statistics.median(med), "min_pct": min(med), "max_pct": max(med),
                "paired_pct": statistics.median(paired), "paired_min_pct": min(paired),
                "paired_max_pct": max(paired),
                "mean_based_pct": statistics.median(mean),
                "step_s": statistics.median(r["step_s"] for r in rounds),
                "bg_cpu_ms_per_step": 1e3 * statistics.median(
                    r["bg_cpu_per_step_s"] for r in rounds),
                "close_s": statistics.median(r["close_s"] for r in rounds),
                "one_time_s": statistics.median(r["one_time_s"] for r in rounds),
            }
            results[f"{w}/{cfg}"] = res
            print(f"{w:4s} {cfg:12s} overhead median {res['median_pct']:+6.2f}% "
                  f"(spread {res['min_pct']:+.2f}..{res['max_pct']:+.2f}%, "
                  f"mean-based {res['mean_based_pct']:+.2f}%; paired {res['paired_pct']:+.2f}% "
                  f"({res['paired_min_pct']:+.2f}..{res['paired_max_pct']:+.2f}%)) "
                  f"step {res['step_s'] * 1e3:.0f} ms, overhead "
                  f"{res['median_pct'] * res['step_s'] * 10:.2f} ms/step, "
                  f"bg cpu {res['bg_cpu_ms_per_step']:.2f}"
                  f" ms/step, close {res['close_s']:.2f} s, one-time {res['one_time_s']:.2f} s",
                  flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
