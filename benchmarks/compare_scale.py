"""Compare benchmark: `tracealyze compare` of two big synthetic runs, and CLI start-up.

Writes two runs of STEPS × TENSORS tensor_stats rows (the analyzer_scale layout: 100,000 ×
200 = 20.6M rows each, different noise draws), then times over a few repeats:

* ``compare_runs`` (what ``tracealyze compare --json`` runs, without process start-up);
* ``write_compare_report`` (``compare -o compare.html``: the same plus the page);
* ``tracealyze --help`` and ``tracealyze compare --help`` as fresh processes (start-up).

Reports median and spread. Target (issue 15): compare ≤ 10 s, ``--help`` ≤ 0.3 s.

    python benchmarks/compare_scale.py                      # 100,000 × 200, 3 repeats
    python benchmarks/compare_scale.py --steps 20000 --tensors 50 --dir /tmp/b
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from analyzer_scale import write_run


def _stats(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} s median ({min(xs):.2f}–{max(xs):.2f})"


def time_cli(args: list[str], repeats: int) -> list[float]:
    exe = Path(sys.executable).with_name("tracealyze")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "tracealyze.analyzer.cli"]
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd + args, check=True, capture_output=True)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--tensors", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp "
                    "dir, removed afterwards)")
    args = ap.parse_args()
    from tracealyze.analyzer.compare.page import write_compare_report
    from tracealyze.analyzer.compare.runs import compare_runs

    root = args.dir or Path(tempfile.mkdtemp(prefix="tracealyze-compare-"))
    try:
        runs = []
        for seed, name in ((0, "base"), (1, "new")):
            rd = root / f"{name}-{args.steps}x{args.tensors}"
            if rd.exists():
                shutil.rmtree(rd)
            rows = write_run(rd, args.steps, args.tensors, seed=seed)
            runs.append(rd)
        print(f"two runs of {args.steps:,} steps × {args.tensors} tensors: {rows:,} "
              f"tensor_stats rows each")
        json_t, page_t = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            result = compare_runs(*runs)
            json_t.append(time.perf_counter() - t0)
        print(f"compare (--json):        {_stats(json_t)}; verdict {result['verdict']} "
              f"{result['regressions'] + result['improvements']}")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out, _ = write_compare_report(*runs, root / "compare.html", threshold=5.0)
            page_t.append(time.perf_counter() - t0)
        print(f"compare -o compare.html: {_stats(page_t)}; page "
              f"{out.stat().st_size / 2**20:.2f} MiB")
        for argv in (["--help"], ["compare", "--help"]):
            t = time_cli(argv, 5)
            print(f"tracealyze {' '.join(argv):15} {_stats(t)}")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
