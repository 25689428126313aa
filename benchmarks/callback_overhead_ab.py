"""Step-interleaved A/B overhead of each framework callback, the method of
``../shared/bench/overhead_ab.py`` carried over to frameworks that own their training loop.

Two trainings of the acceptance harness's ``--model mlp`` workload (48 blocks of
Linear(256)+LayerNorm+ReLU, batch 32, AdamW, torch on one thread) run in one process: A with
the tracealyze callback, B bare. Each runs in its own thread, and a turn is passed between
them at every step boundary (a callback listed last: A's step i, B's step i, A's step i+1,
...), so machine drift hits both alike, as in the harness's alternation. A turn is timed
from one step-begin hook to the next (forward, backward, clipping, the optimizer, every
callback, the next batch's fetch); only one side runs at a time. Per pair:
A/B - 1; the figure is the median over the measured steps. CPU: A's thread CPU plus every
other thread's (the recorder's writer and sampler), over B's thread CPU.

The plain loop's figure, for comparison, is the harness's own:
``python ../shared/bench/overhead_ab.py standard --model mlp --steps 200 --warm 150``.

    python benchmarks/callback_overhead_ab.py hf --repeats 3
    python benchmarks/callback_overhead_ab.py lightning --repeats 3
    python benchmarks/callback_overhead_ab.py hf --aa      # both bare: the method's noise
    AB_MAX_GRAD_NORM=0 python benchmarks/callback_overhead_ab.py hf   # the Trainer unclipped
    AB_KNOBS='{"record_sample_ids": false}' python benchmarks/callback_overhead_ab.py hf
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from integration_overhead import (  # (torch on one thread)
    hf_train,
    lightning_fit,
    plain_fit,
)


class Turns:
    """Passes the turn between the two trainings at each step begin, and times each turn:
    a step and everything up to the next step's begin (the next batch's fetch, the
    framework's loop, every callback). Only one side runs at a time; the recorder's threads
    run beside either."""

    def __init__(self, steps: int, warm: int) -> None:
        self.steps, self.warm = steps, warm
        self.go = {"A": threading.Semaphore(1), "B": threading.Semaphore(0)}
        self.t0: dict[str, float] = {}
        self.c0: dict[str, float] = {}
        self.wall: dict[str, list[float]] = {"A": [], "B": []}
        self.cpu: dict[str, float] = {"A": 0.0, "B": 0.0}  # over the measured turns
        self.done = {"A": False, "B": False}
        self.p0: dict[str, float] = {}
        self.proc: dict[str, float] = {}  # process CPU over each side's measured turns

    def _close(self, me: str) -> None:
        if me in self.t0:
            self.wall[me].append(time.perf_counter() - self.t0[me])
            if len(self.wall[me]) > self.warm:
                self.cpu[me] += time.thread_time() - self.c0[me]
                # The process's CPU over this very turn: this side's thread plus the
                # recorder's threads (the other side is parked). Summed over the measured
                # turns only, so that a side's last turn and its end of training (the
                # recorder's close and final merge) are not charged to the steps, as the
                # plain harness stops its clock before rec.close().
                self.proc[me] = self.proc.get(me, 0.0) + time.process_time() - self.p0[me]

    def begin(self, me: str) -> None:
        other = "B" if me == "A" else "A"
        self._close(me)
        if me in self.t0:
            self.go[other].release()
        if not self.done[other]:  # (a finished side released us for good)
            self.go[me].acquire()
        self.t0[me], self.c0[me] = time.perf_counter(), time.thread_time()
        self.p0[me] = time.process_time()

    def finish(self, me: str) -> None:
        self.done[me] = True
        self.go["B" if me == "A" else "A"].release()


def _knobs() -> dict[str, Any]:
    """Recorder knobs for the callback from ``AB_KNOBS`` (JSON), e.g.
    ``AB_KNOBS='{"record_sample_ids": false}'``."""
    return json.loads(os.environ.get("AB_KNOBS") or "{}")


def hf(me: str, turns: Turns, recorded: bool, out: Path) -> None:
    import transformers

    class Turn(transformers.TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **k: Any) -> None:
            turns.begin(me)

    callbacks: list[Any] = []
    if recorded:
        from tracealyze.recorder.integrations.hf import TracealyzeCallback

        callbacks.append(TracealyzeCallback(run_dir=out / "run", **_knobs()))
    hf_train([*callbacks, Turn()], turns.steps, out,
             max_grad_norm=float(os.environ.get("AB_MAX_GRAD_NORM", "1.0")))


def lightning(me: str, turns: Turns, recorded: bool, out: Path) -> None:
    import lightning.pytorch as L

    class Turn(L.Callback):
        def on_train_batch_start(self, trainer: Any, *a: Any) -> None:
            turns.begin(me)

    callbacks: list[Any] = []
    if recorded:
        from tracealyze.recorder.integrations.lightning import TracealyzeCallback

        callbacks.append(TracealyzeCallback(run_dir=out / "run", **_knobs()))
    lightning_fit([*callbacks, Turn()], turns.steps, out)


def plain(me: str, turns: Turns, recorded: bool, out: Path) -> None:
    """The same workload in a hand-written loop with the plain Recorder: the reference the
    callbacks are held to, measured by this harness's own method (same DataLoader, same
    turn boundary: the step begin, after the batch is fetched)."""
    plain_fit(lambda: turns.begin(me), turns.steps, out, recorded=recorded, knobs=_knobs())


def once(framework: str, steps: int, warm: int, aa: bool) -> dict[str, float]:
    run = {"hf": hf, "lightning": lightning, "plain": plain}[framework]
    # imported here, once: two threads importing a lazy module at once can each see it
    # half-made
    if framework == "plain":
        pass
    elif framework == "hf":
        import transformers

        _ = transformers.TrainerCallback, transformers.Trainer, transformers.TrainingArguments
    else:
        import importlib

        importlib.import_module("lightning.pytorch")
    turns = Turns(steps, warm)
    errors: list[BaseException] = []
    with tempfile.TemporaryDirectory() as td:

        def side(me: str) -> None:
            try:
                run(me, turns, me == "A" and not aa, Path(td) / me)
            except BaseException as e:  # report, and never leave the other side waiting
                errors.append(e)
            finally:
                turns.finish(me)

        threads = [threading.Thread(target=side, args=(me,)) for me in ("A", "B")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    a, b = turns.wall["A"][warm:], turns.wall["B"][warm:]
    # the recorder's threads: the process's CPU over the measured turns less the two sides'
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    pairs = [x / y for x, y in zip(a, b, strict=True)]
    others = max(0.0, turns.proc.get("A", 0.0) + turns.proc.get("B", 0.0)
                 - turns.cpu["A"] - turns.cpu["B"])
    return {"wall": statistics.median(pairs) - 1,
            "cpu": (turns.cpu["A"] + others) / turns.cpu["B"] - 1,
            "step_ms": 1e3 * statistics.median(b),
            # per measured step: each side's own thread CPU and the rest of the process's
            "a_cpu_ms": 1e3 * turns.cpu["A"] / n, "b_cpu_ms": 1e3 * turns.cpu["B"] / n,
            "others_ms": 1e3 * others / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("framework", choices=["hf", "lightning", "plain"])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warm", type=int, default=100,
                    help="steps left out (the standard preset's profiler window is at 50)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--aa", action="store_true", help="both sides bare (A/A)")
    a = ap.parse_args()
    got = [once(a.framework, a.steps, a.warm, a.aa) for _ in range(a.repeats)]
    for g in got:
        print(json.dumps(g), file=sys.stderr)
    worst = [max(g["wall"], g["cpu"]) for g in got]
    print(json.dumps({
        "framework": a.framework + (" A/A" if a.aa else ""), "repeats": a.repeats,
        "steps": a.steps, "warm": a.warm,
        "overhead_median": statistics.median(worst), "overhead_min": min(worst),
        "overhead_max": max(worst),
        "wall_median": statistics.median(g["wall"] for g in got),
        "cpu_median": statistics.median(g["cpu"] for g in got),
        "step_ms": statistics.median(g["step_ms"] for g in got)}))


if __name__ == "__main__":
    main()
