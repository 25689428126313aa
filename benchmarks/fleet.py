"""Fleet benchmarks on a generated fleet (``tests/fleetfactory.py``: 1k-100k steps, 1-64
ranks, 20-400 tensors written on rank 0 as DDP does, ~10% with a pathology, two hosts made
30% slower on purpose). Each figure is printed as it is measured.

* ``cost``: CPU seconds of one run's analysis (``analyse_run``, what each engine task
  does) for a 10k-step, 200-tensor, 1-rank run; median and spread of --repeats, and where
  the time goes (cProfile, top functions).
* ``cold``: ``tracealyze fleet`` (fresh CLI process, local engine, --jobs 2) over --runs
  runs with no index; then warm (nothing changed) over the same runs.
* ``warm``: 10,000 runs with a current index, and 10 new runs among them. The 10,000 are
  --runs generated runs hard-linked into 10,000 / --runs copies; the copies' index rows are
  the originals' (same files, same fingerprints) so the warm state is reached without
  10,000 analyses on a 2-core machine.
* ``spark``: Spark ``local[1]``, ``local[2]`` and the local engine on --runs runs: the
  same rows, and the time of each.
* ``suspect``: ``suspect_host`` on the generated fleet: the slow hosts found, no other.

    python benchmarks/fleet.py cost --repeats 5
    python benchmarks/fleet.py cold --runs 1000 --root /tmp/fleet1k
    python benchmarks/fleet.py warm --runs 1000 --root /tmp/fleet1k
    python benchmarks/fleet.py spark --runs 1000 --root /tmp/fleet1k
    python benchmarks/fleet.py suspect --root /tmp/fleet1k
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fleetfactory import FleetSpec, make_run_of_fleet  # noqa: E402

CLI = [sys.executable, "-c", "from tracealyze.analyzer.cli import main; main()"]
VOLATILE = ("analysis_cpu_s", "analysed_at")


def _fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} s ({min(xs):.2f}-{max(xs):.2f}, n={len(xs)})"


def generate(root: Path, runs: int, seed: int = 0) -> FleetSpec:
    """``runs`` runs under ``root/gen`` (kept between commands: generated once)."""
    spec = FleetSpec(runs=runs, seed=seed)
    note = root / "generated.json"
    if note.exists() and json.loads(note.read_text()).get("runs") == runs:
        spec.made = json.loads(note.read_text())["made"]
        return spec
    shutil.rmtree(root / "gen", ignore_errors=True)
    t = time.perf_counter()
    for i in range(runs):
        make_run_of_fleet(root / "gen", i, spec)
        if (i + 1) % 100 == 0:
            print(f"  generated {i + 1}/{runs} runs ({time.perf_counter() - t:.0f} s)",
                  flush=True)
    note.write_text(json.dumps({"runs": runs, "made": spec.made}))
    return spec


def fleet_cli(*args: object) -> tuple[float, dict]:
    t = time.perf_counter()
    out = subprocess.run([*CLI, "fleet", *map(str, args), "--json", "-q"], check=True,
                         capture_output=True, text=True)
    return time.perf_counter() - t, json.loads(out.stdout)


def cost(repeats: int) -> None:
    import cProfile
    import pstats

    from tracealyze.analyzer.fleet.analyse import analyse_run

    from tests.runfactory import make_run

    with tempfile.TemporaryDirectory() as td:
        run = make_run(Path(td), name="r", steps=10_000, tensors=200, tensor_every=100,
                       memory_every=10)
        analyse_run(str(run))  # imports and first-use costs out of the figure
        cpu = [analyse_run(str(run))["run"]["analysis_cpu_s"] for _ in range(repeats)]
        print(f"per-run analysis, 10k steps x 200 tensors, 1 rank: CPU {_fmt(cpu)}")
        prof = cProfile.Profile()
        prof.enable()
        analyse_run(str(run))
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


def cold(root: Path, runs: int) -> None:
    spec = generate(root, runs)
    shutil.rmtree(root / "gen" / "_tracealyze", ignore_errors=True)
    took, out = fleet_cli(root / "gen", "--jobs", "2")
    print(f"cold: {runs} runs, local engine, 2 processes: {took:.1f} s "
          f"({out['analysed']} analysed)", flush=True)
    warm_s = [fleet_cli(root / "gen")[0] for _ in range(3)]
    print(f"warm: {runs} runs, index current: {_fmt(warm_s)}")
    _suspects(spec, out)


def _suspects(spec: FleetSpec, out: dict) -> None:
    found = sorted(f["subject"] for f in out["fleet_findings"])
    slow = sorted(spec.slow_hosts)
    print(f"suspect_host: named {found or 'none'}; made slow {slow}; "
          f"missed {sorted(set(slow) - set(found)) or 'none'}, "
          f"false {sorted(set(found) - set(slow)) or 'none'}")


def warm(root: Path, runs: int, total: int = 10_000) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    generate(root, runs)
    if not (root / "gen" / "_tracealyze" / "fleet" / "runs" / "data.parquet").exists():
        fleet_cli(root / "gen", "--jobs", "2")
    big = root / "big"
    index = root / "big-index"
    if not (big / "copy-000").exists():
        shutil.rmtree(big, ignore_errors=True)
        shutil.rmtree(index, ignore_errors=True)
        for c in range(total // runs):
            shutil.copytree(root / "gen", big / f"copy-{c:03d}", copy_function=os.link,
                            ignore=shutil.ignore_patterns("_tracealyze"))
        src = root / "gen" / "_tracealyze" / "fleet"
        for table in ("runs", "findings", "ranks"):
            t = pq.read_table(src / table / "data.parquet")
            parts = []
            for c in range(total // runs):
                paths = [p.replace(str(root / "gen"), str(big / f"copy-{c:03d}"), 1)
                         for p in t.column("path").to_pylist()]
                parts.append(t.set_column(t.schema.get_field_index("path"), "path",
                                          pa.array(paths, pa.string())))
            (index / table).mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.concat_tables(parts), index / table / "data.parquet")
        shutil.copy(src / "index.json", index / "index.json")
    took = [fleet_cli(big, "--index", index)[0] for _ in range(3)]
    n = fleet_cli(big, "--index", index)[1]
    print(f"warm: {len(n['runs'])} runs, index current: {_fmt(took)} "
          f"({n['analysed']} analysed)", flush=True)
    spec = FleetSpec(runs=10, seed=99)
    for i in range(10):
        make_run_of_fleet(big / "new", i, spec)
    t, out = fleet_cli(big, "--index", index, "--jobs", "2")
    print(f"10 new runs among {len(out['runs'])}: {t:.2f} s ({out['analysed']} analysed)")
    shutil.rmtree(big / "new")
    fleet_cli(big, "--index", index)  # (the index back to the 10,000)


def spark(root: Path, runs: int) -> None:
    generate(root, runs)
    got = {}
    for name, args in (("local engine, 2 processes", ["--jobs", "2"]),
                       ("spark local[1]", ["--engine", "spark", "--spark-master", "local[1]"]),
                       ("spark local[2]", ["--engine", "spark", "--spark-master", "local[2]"])):
        idx = root / f"index-{name.split()[0]}-{name[-2]}"
        shutil.rmtree(idx, ignore_errors=True)
        took, out = fleet_cli(root / "gen", "--index", idx, *args)
        rows = [{k: v for k, v in r.items() if k not in VOLATILE} for r in out["runs"]]
        got[name] = rows
        print(f"{name}: {runs} runs in {took:.1f} s", flush=True)
    base = got["local engine, 2 processes"]
    for name, rows in got.items():
        print(f"  {name}: rows {'identical to' if rows == base else 'DIFFER from'} the "
              "local engine's")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["cost", "cold", "warm", "spark", "suspect"])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "tz-fleet")
    a = ap.parse_args()
    a.root.mkdir(parents=True, exist_ok=True)
    if a.what == "cost":
        cost(a.repeats)
    elif a.what == "cold":
        cold(a.root, a.runs)
    elif a.what == "warm":
        warm(a.root, a.runs)
    elif a.what == "spark":
        spark(a.root, a.runs)
    else:
        spec = generate(a.root, a.runs)
        _suspects(spec, fleet_cli(a.root / "gen", "--jobs", "2")[1])


if __name__ == "__main__":
    main()
