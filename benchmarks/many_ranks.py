"""Many-rank jobs: import-trace DIR, summary and report, timed as a user runs them (fresh
`tracealyze` processes), median and spread over --repeats.

    python benchmarks/many_ranks.py --repeats 3

Jobs (benchmarks/multirank_jobs.py): a 64-rank job assembled from the shipped sampled trace
(one rank reaches its collectives late), a synthetic 1,024-rank trace job (one rank computes
50% longer), and a recorder run of 1,024 ranks × 300 steps (one rank 50% slower, as in the
issue). Targets: summary ≤ 60 s on the trace jobs; report ≤ 10 s on the 1,024-rank jobs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from multirank_jobs import assembled_job, synthetic_job  # noqa: E402


def timed(*args: str) -> tuple[float, str]:
    t = time.perf_counter()
    p = subprocess.run(["tracealyze", *args], capture_output=True, text=True)
    dt = time.perf_counter() - t
    if p.returncode not in (0, 1):
        raise SystemExit(f"tracealyze {' '.join(args)} failed: {p.stderr[-2000:]}")
    return dt, p.stdout


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):6.2f} s ({min(xs):.2f}–{max(xs):.2f})"


def bench_traces(name: str, traces: Path, work: Path, repeats: int, expect: str) -> None:
    imports, summaries, reports = [], [], []
    for k in range(repeats):
        run = work / f"{name}-run{k}"
        shutil.rmtree(run, ignore_errors=True)
        imports.append(timed("import-trace", "-q", str(traces), str(run))[0])
        dt, out = timed("summary", "--json", str(run))
        summaries.append(dt)
        found = [f for f in json.loads(out)["findings"] if f["id"] == "straggler"]
        named = [f["subject"] for f in found]
        reports.append(timed("report", str(run), "-o", str(work / f"{name}.html"))[0])
    size = (work / f"{name}.html").stat().st_size / 2**20
    print(f"{name:28} import {fmt(imports)}  summary {fmt(summaries)}  report "
          f"{fmt(reports)}  page {size:.2f} MiB  straggler {named} (planted: {expect})")


def bench_recorder(work: Path, repeats: int) -> None:
    from tests.runfactory import make_run

    run = make_run(work / "rec", ranks=1024, steps=300,
                   duration={r: (0.15 if r == 717 else 0.1) for r in range(1024)})
    summaries = [timed("summary", str(run))[0] for _ in range(repeats)]
    reports = [timed("report", str(run), "-o", str(work / "rec.html"))[0]
               for _ in range(repeats)]
    size = (work / "rec.html").stat().st_size / 2**20
    print(f"{'recorder 1,024 x 300 steps':28} summary {fmt(summaries)}  report {fmt(reports)}"
          f"  page {size:.2f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tracealyze-ranks-bench-"))
    try:
        asm = assembled_job(work / "asm64", ranks=64, slow=[41])
        bench_traces("64 ranks (shipped trace)", asm, work, a.repeats, "rank 41")
        syn = synthetic_job(work / "syn1024", ranks=1024, slow=[717])
        bench_traces("1,024 ranks (synthetic)", syn, work, a.repeats, "rank 717")
        bench_recorder(work, a.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
