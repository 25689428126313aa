"""What one recorder knob costs: two identical replicas in one process, both recorded with the
same preset, one with the knob on and one with it off; their steps alternate (ABBA) and are
fed by their own DataLoader over the same data (so ``record_sample_ids`` has a sampler to tap).
The figure is the median over pairs of (on step / off step) − 1, plus the extra CPU of the
"on" recorder's background threads per step; median and spread over rounds.

    python benchmarks/knob_ab.py record_sample_ids --preset standard --rounds 3
    python benchmarks/knob_ab.py anomaly_mode --on after_nonfinite --off false --preset debug

``--on``/``--off`` give the two values (default true/false; ``false``, ``true`` and numbers
are parsed, anything else is a string).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tracealyze.recorder import Recorder
from workloads import WORKLOADS, build


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return float(text) if "." in text else int(text)
    except ValueError:
        return text


def _thread_cpu(idents: list[int]) -> float:
    total = 0.0
    for ident in idents:
        try:
            total += time.clock_gettime(time.pthread_getcpuclockid(ident))
        except OSError:
            pass
    return total


def one_round(args: argparse.Namespace, seed: int) -> tuple[float, float]:
    _, make_batch, loss_fn = WORKLOADS[args.workload]
    g = torch.Generator().manual_seed(seed)
    xs, ys = zip(*(make_batch(g) for _ in range(8)), strict=True)
    data = torch.utils.data.TensorDataset(torch.cat(xs), torch.cat(ys))
    batch = xs[0].shape[0]
    sides = {}
    tmp = tempfile.mkdtemp(prefix="tz-knob-")
    for side, value in (("on", args.on), ("off", args.off)):
        model, opt = build(args.workload, seed)
        before = {t.ident for t in threading.enumerate()}
        rec = Recorder(Path(tmp) / side, model=model, optimizer=opt, preset=args.preset,
                       profile_start=0, **{args.knob: value})
        bg = [t.ident for t in threading.enumerate() if t.ident not in before]
        loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True)
        sides[side] = (model, opt, rec, loader, bg)

    def batches(side: str) -> Any:
        while True:
            yield from sides[side][2].wrap_loader(sides[side][3])

    its = {s: batches(s) for s in sides}

    def step(side: str) -> float:
        model, opt, rec, _, _ = sides[side]
        t0 = time.perf_counter()
        x, y = next(its[side])
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        rec.step(loss=loss)
        return time.perf_counter() - t0

    ratios, cpu0 = [], None
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            cpu0 = {s: _thread_cpu(sides[s][4]) for s in sides}
        order = ("on", "off") if i % 2 == 0 else ("off", "on")
        t = {s: step(s) for s in order}
        if i >= args.warmup:
            ratios.append((t["on"], t["off"]))
    assert cpu0 is not None
    bg = {s: _thread_cpu(sides[s][4]) - cpu0[s] for s in sides}
    for s in sides:
        sides[s][2].close()
    off_med = statistics.median(b for _, b in ratios)
    paired = statistics.median(a / b for a, b in ratios) - 1
    return paired + (bg["on"] - bg["off"]) / args.steps / off_med, off_med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("knob")
    ap.add_argument("--on", default="true")
    ap.add_argument("--off", default="false")
    ap.add_argument("--preset", default="standard")
    ap.add_argument("--workload", default="mlp", choices=sorted(WORKLOADS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=60)
    args = ap.parse_args()
    args.on, args.off = _value(args.on), _value(args.off)
    torch.set_num_threads(1)
    res = [one_round(args, seed=r) for r in range(args.rounds)]
    pct = [100 * r for r, _ in res]
    print(f"{args.knob}={args.on!r} against {args.off!r} ({args.preset}, {args.workload}, "
          f"{1e3 * statistics.median(s for _, s in res):.1f} ms steps): median "
          f"{statistics.median(pct):+.3f}% (spread {min(pct):+.3f}..{max(pct):+.3f}%, "
          f"{args.rounds} rounds of {args.steps} pairs)")


if __name__ == "__main__":
    main()
