"""The full diagnosis matrix (#26): every architecture × every cell, seeds 0–4 by default,
recorded with the real Recorder (one fresh process per model and seed, ``--parallel`` at a
time) and judged by the real analyzer; prints the rates table that README shows.

    python benchmarks/matrix.py --root /tmp/matrix                  # seeds 0-4
    python benchmarks/matrix.py --root /tmp/matrix --seeds 1 2 --parallel 2
    python benchmarks/matrix.py --root /tmp/matrix --judge-only     # re-judge recorded runs
    python benchmarks/matrix.py --root /tmp/new --pathologies nan_backward late_block

The suite records a slice of seed 0 that has every architecture and every cell at least once
(tests/matrix/test_matrix.py; TRACEALYZE_FULL_MATRIX=1 runs every cell there). Runs already
recorded under --root are kept (delete the folder to record again).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.matrix.rates import rates_table  # noqa: E402
from tests.matrix.test_matrix import jobs, run_jobs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--judge-only", action="store_true")
    ap.add_argument("--pathologies", nargs="+", help="only these cells (default: all)")
    args = ap.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    if not args.judge_only:
        for seed in args.seeds:
            todo = []
            for cells in jobs(seed):
                if args.pathologies:
                    cells = [c for c in cells if c.split(":")[1] in args.pathologies]
                    if not cells:
                        continue
                # a job whose runs are all recorded already is skipped
                names = [c.split(":") for c in cells]
                if not all((args.root / (f"{m}-{p}" + (f"-s{seed}" if seed else ""))
                            / "run.json").exists() for m, p, *_ in names):
                    todo.append(cells)
            t0 = time.perf_counter()
            failures = run_jobs(args.root, todo, parallel=args.parallel)
            print(f"seed {seed}: {len(todo)} processes in {time.perf_counter() - t0:.0f} s"
                  + (f"; {len(failures)} failed:\n" + "\n".join(failures) if failures else ""),
                  file=sys.stderr, flush=True)
    print(rates_table(args.root))


if __name__ == "__main__":
    main()
