"""Where a preset's extra time goes, op by op: a few steps of GPT-2 small (or another
benchmarks/workloads.py workload) under torch.profiler, bare and under each configuration,
and the ops whose self device time and self host time grew the most against bare. Run from
the repository root:

    python tools/gpu/kernels.py cuda gpt2 "debug,debug guard=0,debug act_nf=0"

A diagnosis, not a figure to report: the profiler slows every op (benchmarks/overhead.py
measures). Configurations are prof.py's.
"""

from __future__ import annotations

import collections
import sys
import tempfile
from typing import Any

import torch

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "tools/gpu")
from prof import CONFIGS
from tracealyze.recorder import Recorder
from workloads import WORKLOADS, build

STEPS = 4


def main() -> None:
    dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    wl = sys.argv[2] if len(sys.argv) > 2 else "gpt2"
    want = sys.argv[3].split(",") if len(sys.argv) > 3 else ["debug"]
    torch.set_float32_matmul_precision("high")
    torch.manual_seed(0)
    model, opt = build(wl, 0, dev)
    _, make, lossf = WORKLOADS[wl]
    x, y = (t.to(dev) for t in make(torch.Generator().manual_seed(0)))
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)

    def table(knobs: dict[str, Any] | None) -> dict[str, tuple[float, float, int]]:
        rec = None if knobs is None else Recorder(
            tempfile.mkdtemp() + "/r", model=model, optimizer=opt, profile_start=10**8,
            **knobs)

        def step() -> None:
            loss = lossf(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if rec is not None:
                rec.step(loss=loss)

        for _ in range(12):
            step()
        if dev == "cuda":
            torch.cuda.synchronize()
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(STEPS):
                step()
            if dev == "cuda":
                torch.cuda.synchronize()
        if rec is not None:
            rec.close()
        out: dict[str, tuple[float, float, int]] = collections.defaultdict(lambda: (0, 0, 0))
        for e in prof.key_averages():
            d = getattr(e, "self_device_time_total", 0) or 0
            c = e.self_cpu_time_total or 0
            o = out[e.key]
            out[e.key] = (o[0] + d / STEPS / 1e3, o[1] + c / STEPS / 1e3, o[2] + e.count // STEPS)
        return out

    table(None)  # (warm-up)
    base = table(None)
    tot = (sum(v[0] for v in base.values()), sum(v[1] for v in base.values()))
    print(f"bare: device {tot[0]:.2f} ms/step, host self {tot[1]:.2f} ms/step", flush=True)
    for name in want:
        t = table(CONFIGS[name])
        dt = (sum(v[0] for v in t.values()), sum(v[1] for v in t.values()))
        print(f"\n== {name}: device {dt[0]:.2f} ms/step (+{dt[0] - tot[0]:.2f}), host self "
              f"{dt[1]:.2f} (+{dt[1] - tot[1]:.2f})", flush=True)
        keys = set(t) | set(base)
        diff = {k: tuple(t.get(k, (0, 0, 0))[i] - base.get(k, (0, 0, 0))[i] for i in range(3))
                for k in keys}
        for col, label in ((0, "device"), (1, "host")):
            print(f"-- grew most, {label} ms/step (calls/step added)")
            for k in sorted(diff, key=lambda k: -diff[k][col])[:12]:
                print(f"  {diff[k][col]:+8.3f}  ({diff[k][2]:+5d})  {k[:110]}")


if __name__ == "__main__":
    main()
