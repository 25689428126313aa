"""Reading a run left uncompacted: ``summary`` of a run with 16,000 small parts (4 tables x
4,000 parts of 2 steps each, as ``merge_on_close=False`` or an old recorder leaves them),
against the same run in one part per table. Fresh CLI processes, cold from before the
imports; median and spread of --repeats.

    python benchmarks/many_parts.py --repeats 3
    python benchmarks/many_parts.py --parts 1000 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.runfactory import make_run  # noqa: E402


def timed(run: Path) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "from tracealyze.analyzer.cli import main; main()",
                    "summary", str(run), "--json"], check=True, capture_output=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", type=int, default=4000, help="parts per table (4 tables)")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as td:
        kw = dict(steps=2 * a.parts, tensors=4, metrics={"acc": 0.5})
        many = make_run(Path(td), name="many", parts=a.parts, **kw)
        one = make_run(Path(td), name="one", parts=1, **kw)
        files = sum(1 for _ in many.rglob("part-*.parquet"))
        for name, run in (("uncompacted", many), ("compacted", one)):
            ts = [timed(run) for _ in range(a.repeats)]
            print(f"{name:12s} {files if run is many else 4:6d} parts  summary "
                  f"{statistics.median(ts):.2f} s (min {min(ts):.2f}, max {max(ts):.2f})")


if __name__ == "__main__":
    main()
