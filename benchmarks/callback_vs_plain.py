"""A framework callback's overhead against the plain loop's, measured in alternation.

Each round runs the plain loop and then ``callback_overhead_ab.py <framework> --repeats 1``
on the same workload, each in its own process, so that slow drift of the machine hits both
alike. The plain loop is measured by the same method as the callback by default
(``--reference turns``: ``callback_overhead_ab.py plain``, a hand-written loop over the same
DataLoader with the plain Recorder, timed between the same step boundaries in the same two-
thread turn harness). ``--reference harness`` takes the accepted harness instead
(``../shared/bench/overhead_ab.py standard --model mlp``); it times only forward, backward
and the optimizer over four fixed batches, with no DataLoader, no batch fetch and no second
training thread, so its figure is lower than any turn-harness figure by the method alone
(measured: the plain loop reads +3..4% there and +4..+12% in the turn harness). A figure is
the larger of the wall and CPU overheads, as each harness reports them; the gap is callback
minus plain, per round, and its median over the rounds is the answer to "does the callback
cost more than the loop it replaces". Single runs of either harness scatter by several
points on a shared 2-core machine; the per-round gap and many rounds are what make the
median stable.

    python benchmarks/callback_vs_plain.py hf --rounds 7
    python benchmarks/callback_vs_plain.py lightning --rounds 7
    python benchmarks/callback_vs_plain.py lightning --reference harness
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
HARNESS = HERE.parent.parent / "shared" / "bench" / "overhead_ab.py"


def _last_json(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=HERE.parent)
    return json.loads(out.stdout.strip().splitlines()[-1])


def plain(reference: str) -> float:
    if reference == "turns":
        return callback("plain")
    got = _last_json([sys.executable, str(HARNESS), "standard", "--model", "mlp",
                      "--steps", "200", "--warm", "150"])
    return max(got["wall_overhead"], got["cpu_overhead"])


def callback(framework: str) -> float:
    got = _last_json([sys.executable, str(HERE / "callback_overhead_ab.py"), framework,
                      "--repeats", "1"])
    return float(got["overhead_median"])


def spread(xs: list[float]) -> str:
    return f"{100 * statistics.median(xs):+.2f}% ({100 * min(xs):+.2f}..{100 * max(xs):+.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("framework", choices=["hf", "lightning"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reference", choices=["turns", "harness"], default="turns",
                    help="how the plain loop is measured (default: by the callback's method)")
    a = ap.parse_args()
    if a.reference == "harness" and not HARNESS.exists():
        sys.exit(f"the accepted harness is not at {HARNESS}")
    ps: list[float] = []
    cs: list[float] = []
    for i in range(a.rounds):
        ps.append(plain(a.reference))
        cs.append(callback(a.framework))
        print(f"round {i + 1}: plain {100 * ps[-1]:+.2f}%  {a.framework} {100 * cs[-1]:+.2f}%",
              file=sys.stderr, flush=True)
    gaps = [c - p for c, p in zip(cs, ps, strict=True)]
    print(json.dumps({"framework": a.framework, "reference": a.reference, "rounds": a.rounds,
                      "plain": spread(ps),
                      "callback": spread(cs), "gap_pp": spread(gaps).replace("%", " pp"),
                      "gap_median_pp": 100 * statistics.median(gaps)}))


if __name__ == "__main__":
    main()
