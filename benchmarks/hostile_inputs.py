"""The attacker's pass (issue 42) by the hundred: N hostile cases (``tests/hostile``:
planted links at every name the analyzer might create, forged and huge fleet indexes,
folder chains 1,500 deep, names that are not UTF-8 or hold quotes, newlines and SQL, SQL
that writes), each feature drawn with probability 1/3 from a fixed seed, and every CLI
command run over each (in this process, as tests/analyzer/test_trust_property.py does)
through the same checks: nothing written outside the declared outputs, exit 0 or 2 (2: one
stderr line, no traceback), under 30 s, no SECRET read from outside the root.

    python benchmarks/hostile_inputs.py                  # 300 cases, seed 0
    python benchmarks/hostile_inputs.py --cases 20 --seed 3

Prints ``hostile inputs: N tried, M clean``, then one line per failure: the command, the
case's features and SQL (indexes into ``hostile.SQLS``), and what broke. Exit status 1
when any case was not clean.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.hostile import (  # noqa: E402  (after the repo root is on the path)
    Tally,
    build_case,
    draw_spec,
    environment,
    remove_tree,
    run_case,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=300, help="cases to try (default 300)")
    ap.add_argument("--seed", type=int, default=0, help="the draw's seed (default 0)")
    ap.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    tally = Tally()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        for i in range(1, args.cases + 1):
            spec = draw_spec(rng)
            base = Path(tempfile.mkdtemp(prefix=f"case{i:04d}-", dir=tmp))
            try:
                case = build_case(base, spec)
                with environment(case):
                    tally.add(run_case(case))
            finally:
                remove_tree(base)  # (before TemporaryDirectory's rmtree: it recurses)
            if not args.quiet and (i % 10 == 0 or i == args.cases):
                print(f"[{i}/{args.cases}] {tally.clean} clean, {len(tally.failures)} "
                      f"failures ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    print(tally.line())
    for f in tally.failures:
        print(f.line())
    return 0 if tally.clean == tally.tried else 1


if __name__ == "__main__":
    sys.exit(main())
