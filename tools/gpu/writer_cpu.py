"""Where the recorder's background CPU goes on CUDA, and what the writer's way of waiting
for a step's device-to-host copy costs. From the repository root on a CUDA machine:

    python tools/gpu/writer_cpu.py poll                 # CPU per thread, writer profile
    python tools/gpu/writer_cpu.py blocking run benchmarks/overhead.py --device cuda ...

VARIANT: ``blocking`` (the code as it is: a blocking-sync event the writer
``synchronize()``s, asleep in the driver until the GPU passes it) or ``poll`` (what it
replaced: a default event, ``query()`` between sleeps of 0.5 ms doubling to 10 ms).
With ``run SCRIPT ARGS``, the variant is patched in and
SCRIPT runs as ``__main__`` (the overhead benchmark, say); without, GPT-2 small trains
60 + 100 steps under the standard preset and each thread's CPU over the 100 is printed
(schedstat: every thread of the process, Python's or not), then a cProfile started on the
writer thread (on Python 3.12 it sees every thread: read it as the whole process).
"""

from __future__ import annotations

import cProfile
import os
import pstats
import runpy
import sys
import tempfile
import time

import torch

sys.path.insert(0, "benchmarks")


def patch(variant: str) -> dict[str, int]:
    """Patch the writer's wait to ``variant``; the counters it keeps (waits, polls)."""
    from tracealyze.recorder import capture
    from tracealyze.recorder.write import devwait, rows

    counts = {"waits": 0, "sleeps": 0, "done_at_once": 0}
    real = torch.cuda.Event
    if variant == "blocking":  # the code as it is
        def wait(event):
            counts["waits"] += 1
            counts["done_at_once"] += bool(event.query())
            devwait.wait_for(event)
    elif variant == "poll":  # what it replaced: a default event, query() between sleeps
        capture.torch.cuda.Event = lambda **kw: real()  # type: ignore

        def wait(event):
            counts["waits"] += 1
            delay = 0.0005
            before = counts["sleeps"]
            while not event.query():
                counts["sleeps"] += 1
                time.sleep(delay)
                delay = min(delay * 2, 0.01)
            counts["done_at_once"] += counts["sleeps"] == before
    else:
        raise SystemExit(f"unknown variant {variant!r}")
    rows.wait_for = wait
    return counts


def thread_cpu() -> dict[str, float]:
    """Seconds on a CPU so far, per thread name (schedstat, ns resolution)."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except OSError:
            continue
        out[f"{names.get(int(tid), name)}[{tid}]"] = ns / 1e9
    return out


def measure(variant: str) -> None:
    from tracealyze.recorder import Recorder
    from tracealyze.recorder.write import writer as wmod
    from workloads import WORKLOADS, build, timed_step

    counts = patch(variant)
    prof = cProfile.Profile()
    real_run = wmod.Writer._run

    def run(self):
        prof.runcall(real_run, self)
    wmod.Writer._run = run
    torch.set_float32_matmul_precision("high")
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # (cpu: a dry run of this script)
    model, opt = build("gpt2" if dev == "cuda" else "gpt", 0, dev)
    _, make, lossf = WORKLOADS["gpt2" if dev == "cuda" else "gpt"]
    x, y = (t.to(dev) for t in make(torch.Generator().manual_seed(0)))
    for _ in range(5):
        timed_step(model, opt, lossf, x, y, None, dev == "cuda")
    rec = Recorder(tempfile.mkdtemp() + "/r", model=model, optimizer=opt, preset="standard")
    steps = []
    for i in range(int(os.environ.get("WCPU_STEPS", "160"))):
        if i == 60:
            c0 = thread_cpu()
            counts.update(waits=0, sleeps=0, done_at_once=0)
        t = timed_step(model, opt, lossf, x, y, rec, dev == "cuda")
        if i >= 60:
            steps.append(t)
    c1 = thread_cpu()
    n = len(steps)
    print(f"== {variant}: median step {1e3 * sorted(steps)[n // 2]:.2f} ms; waits "
          f"{counts['waits']}, sleeps {counts['sleeps']}, done at once "
          f"{counts['done_at_once']}", flush=True)
    for k in sorted(c1, key=lambda k: -(c1[k] - c0.get(k, 0.0))):
        d = c1[k] - c0.get(k, 0.0)
        if d > 1e-4:
            print(f"   {k:32s} {1e3 * d / n:8.3f} ms a step", flush=True)
    rec.close()
    st = pstats.Stats(prof)
    st.sort_stats("tottime").print_stats(14)


def main() -> None:
    variant = sys.argv[1]
    if len(sys.argv) > 2 and sys.argv[2] == "run":
        patch(variant)
        sys.argv = sys.argv[3:]
        runpy.run_path(sys.argv[0], run_name="__main__")
        return
    measure(variant)


if __name__ == "__main__":
    main()
