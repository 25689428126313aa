"""The recorder's own work on the training thread per step, under each integration: a
profile, not a timing, so that the comparison is not at the mercy of the machine's noise.

Each side trains the workload of ``callback_procs.py`` (the MLP over a DataLoader, one
thread) in a fresh process, recorded, under cProfile from step 100 to step 300: the plain
loop (``Recorder``, ``rec.wrap_loader``, ``rec.step``; also clipping at 1.0, the reference
for transformers, whose Trainer clips), and Lightning's and transformers'
``TracealyzeCallback``. The figure is the time spent inside tracealyze's own functions
(their ``tottime``: the loss capture, the loader timing, the hooks, the step's commit), per
step; framework code that calls a callback is not ours and is left out. cProfile slows
Python code about alike on every side, so the difference between the sides, not the
figures, is what to read; the writer's and sampler's threads are not profiled (the same
code on every side).

    python benchmarks/callback_profile.py --rounds 3
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STEPS, WARM = 300, 100
SIDES = ("plain", "lightning", "plain_clip", "hf")
"""hf is held to the plain loop that clips as transformers' Trainer does (max_grad_norm 1)."""


class Window:
    """Profiles the steps WARM..STEPS (``tick()`` at each step's begin)."""

    def __init__(self) -> None:
        self.n = 0
        self.prof = cProfile.Profile()

    def tick(self) -> None:
        self.n += 1
        if self.n == WARM:
            self.prof.enable()
        elif self.n == STEPS:
            self.prof.disable()


def own_ms_per_step(prof: cProfile.Profile) -> float:
    """Milliseconds per profiled step spent in the functions of tracealyze's own files."""
    import tracealyze.recorder

    root = str(Path(tracealyze.recorder.__file__).resolve().parents[1])
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    own = sum(tt for (file, _, _), (_, _, tt, _, _) in stats.items()
              if file.startswith(root) and "/benchmarks/" not in file)
    return 1e3 * own / (STEPS - WARM)


def child(side: str) -> None:
    from callback_procs import _framework
    from integration_overhead import plain_fit

    w = Window()
    with tempfile.TemporaryDirectory() as td:
        if side.startswith("plain"):
            plain_fit(w.tick, STEPS + 1, Path(td), recorded=True, clip=side == "plain_clip")
        else:
            _framework("hf" if side == "hf" else "lightning", True, Path(td), w)
    print(json.dumps({"own_ms": own_ms_per_step(w.prof)}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.path.insert(0, str(HERE))
        child(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    got: dict[str, list[float]] = {s: [] for s in SIDES}
    for i in range(a.rounds):
        k = i % len(SIDES)
        for side in SIDES[k:] + SIDES[:k]:  # rotate: drift hits every slot alike
            out = subprocess.run([sys.executable, __file__, "--child", side],
                                 capture_output=True, text=True, check=True, cwd=HERE.parent)
            got[side].append(json.loads(out.stdout.strip().splitlines()[-1])["own_ms"])
        print(f"round {i + 1}: " + ", ".join(f"{s} {got[s][-1]:.3f} ms" for s in SIDES),
              file=sys.stderr, flush=True)

    def fmt(xs: list[float]) -> str:
        return f"{statistics.median(xs):.3f} ms ({min(xs):.3f}..{max(xs):.3f})"
    res: dict[str, Any] = {s: fmt(got[s]) for s in SIDES}
    for s, ref in (("lightning", "plain"), ("hf", "plain_clip")):
        res[f"{s}_minus_{ref}"] = fmt([f - p for f, p in zip(got[s], got[ref], strict=True)])
    print(json.dumps(res))


if __name__ == "__main__":
    main()
