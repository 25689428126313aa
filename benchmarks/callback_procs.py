"""A framework callback's overhead against the plain loop's, each training in a process of its
own: no second training in the process (the turn harness's two threads share one allocator
and the malloc thresholds the recorder sets), the same workload and the same step boundary.

Each round runs four fresh processes in rotating order: the plain loop bare and recorded
(the plain Recorder, ``rec.wrap_loader``, ``rec.step``), and the framework bare and
recorded (its ``TracealyzeCallback``). The workload is the acceptance harness's MLP (48 ×
Linear(256)+LayerNorm+ReLU, AdamW, torch on one thread) over a DataLoader of batch 32; the
plain loop clips at 1.0 when the framework does (transformers' default ``max_grad_norm``).
A process's cost per step is its training thread's CPU (the median over steps 100..300,
timed from one step begin to the next: the framework's loop, every callback and the next
batch's fetch) plus the CPU of its other threads (the recorder's writer and sampler) over
those steps, per step. Overhead = recorded / bare − 1, per round and side; the gap is the
framework's minus the plain loop's, per round, reported as median and spread.

    python benchmarks/callback_procs.py lightning --rounds 7
    python benchmarks/callback_procs.py hf --rounds 7
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STEPS, WARM = 300, 100


def _result(clock: Any) -> dict[str, float]:
    """Per measured step (WARM..STEPS): the training thread's median CPU, and the other
    threads' CPU (the process's less the training thread's) spread over the steps."""
    t, p = clock.thread[WARM:STEPS + 1], clock.cpu[WARM:STEPS + 1]
    per_step = [b - a for a, b in itertools.pairwise(t)]
    others = max(0.0, (p[-1] - p[0]) - (t[-1] - t[0])) / len(per_step)
    return {"thread_ms": 1e3 * statistics.median(per_step), "others_ms": 1e3 * others,
            "steps": len(per_step)}


def _framework(kind: str, recorded: bool, out: Path, b: Any) -> None:
    from integration_overhead import hf_train, lightning_fit

    if kind == "hf":
        import transformers
        from tracealyze.recorder.integrations.hf import TracealyzeCallback as HFCallback

        class HFTick(transformers.TrainerCallback):
            def on_step_begin(self, *a: Any, **k: Any) -> None:
                b.tick()

        cbs: list[Any] = [HFCallback(run_dir=out / "run")] if recorded else []
        hf_train([*cbs, HFTick()], STEPS + 1, out)
        return
    import lightning.pytorch as L
    from tracealyze.recorder.integrations.lightning import TracealyzeCallback as LCallback

    class LTick(L.Callback):
        def on_train_batch_start(self, *a: Any) -> None:
            b.tick()

    cbs = [LCallback(run_dir=out / "run")] if recorded else []
    lightning_fit([*cbs, LTick()], STEPS + 1, out)


def child(side: str, kind: str, recorded: bool) -> None:
    from integration_overhead import Clock, plain_fit

    clock = Clock()
    with tempfile.TemporaryDirectory() as td:
        if side == "plain":
            plain_fit(clock.tick, STEPS + 1, Path(td), recorded=recorded, clip=kind == "hf")
        else:
            _framework(kind, recorded, Path(td), clock)
    print(json.dumps(_result(clock)))


def _run(side: str, kind: str, recorded: bool) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--child", side, kind,
                          "rec" if recorded else "bare"], capture_output=True, text=True,
                         check=True, cwd=HERE.parent)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cost(r: dict[str, float]) -> float:
    return r["thread_ms"] + r["others_ms"]


def spread(xs: list[float], unit: str = "%", scale: float = 100.0) -> str:
    return (f"{scale * statistics.median(xs):+.2f}{unit} "
            f"({scale * min(xs):+.2f}..{scale * max(xs):+.2f})")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.path.insert(0, str(HERE))
        child(sys.argv[2], sys.argv[3], sys.argv[4] == "rec")
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("framework", choices=["hf", "lightning"])
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    jobs = [("plain", False), ("plain", True), ("fw", False), ("fw", True)]
    ov: dict[str, list[float]] = {"plain": [], "fw": []}
    ms: dict[str, list[float]] = {"plain": [], "fw": []}
    for i in range(a.rounds):
        got: dict[tuple[str, bool], dict[str, float]] = {}
        for side, rec in jobs[i % 4:] + jobs[:i % 4]:  # rotate: drift hits every slot alike
            got[side, rec] = _run(side, a.framework, rec)
        for side in ("plain", "fw"):
            bare, recd = _cost(got[side, False]), _cost(got[side, True])
            ov[side].append(recd / bare - 1)
            ms[side].append(recd - bare)
        print(f"round {i + 1}: plain {100 * ov['plain'][-1]:+.2f}% "
              f"{a.framework} {100 * ov['fw'][-1]:+.2f}%", file=sys.stderr, flush=True)
    gaps = [f - p for f, p in zip(ov["fw"], ov["plain"], strict=True)]
    print(json.dumps({
        "framework": a.framework, "rounds": a.rounds, "plain": spread(ov["plain"]),
        "callback": spread(ov["fw"]), "gap_pp": spread(gaps, " pp"),
        "gap_median_pp": 100 * statistics.median(gaps),
        "plain_ms_per_step": spread(ms["plain"], " ms", 1.0),
        "callback_ms_per_step": spread(ms["fw"], " ms", 1.0)}))


if __name__ == "__main__":
    main()
