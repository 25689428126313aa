"""Report scale benchmark: time `tracealyze report` on a big synthetic run.

Reuses the analyzer benchmark's vectorised pyarrow generator (benchmarks/analyzer_scale.py:
STEPS × TENSORS tensor_stats rows, plus steps and memory), then times write_report (what
`tracealyze report` runs, without process start-up: summary + charts + HTML) over a few
repeats and prints median and spread, the file size and the size of the embedded chart data,
for the requested size and a 10× shorter run (the embedded data must not grow with the run).

    python benchmarks/report_scale.py                       # 100,000 steps × 200 tensors
    python benchmarks/report_scale.py --steps 20000 --tensors 50 --repeats 3 --dir /tmp/b
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from analyzer_scale import write_run
from tracealyze.analyzer.report.page import write_report

DATA_RE = re.compile(rb'<script type="application/json" id="tz-data">(.*?)</script>', re.S)


def measure(run_dir: Path, out: Path, repeats: int) -> dict[str, float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        write_report(run_dir, out, progress=False)
        times.append(time.perf_counter() - t0)
    raw = out.read_bytes()
    m = DATA_RE.search(raw)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "file_mb": len(raw) / 2**20, "data_mb": len(m.group(1)) / 2**20 if m else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--tensors", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None, help="where to write the runs (temp)")
    args = ap.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="report_scale_"))
    try:
        for steps in (args.steps, max(100, args.steps // 10)):
            run_dir = base / f"run_{steps}x{args.tensors}"
            if run_dir.exists():
                shutil.rmtree(run_dir)
            t0 = time.perf_counter()
            rows = write_run(run_dir, steps, args.tensors)
            gen = time.perf_counter() - t0
            r = measure(run_dir, base / f"report_{steps}.html", args.repeats)
            print(f"{steps:,} steps × {args.tensors} tensors = {rows:,} tensor_stats rows "
                  f"(generated in {gen:.1f} s)")
            print(f"  report: median {r['median_s']:.2f} s (min {r['min_s']:.2f}, "
                  f"max {r['max_s']:.2f}) over {args.repeats} runs; file {r['file_mb']:.2f} MiB, "
                  f"embedded data {r['data_mb']:.2f} MiB")
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
