"""Record the runs shipped in ``sample_traces/``: one per pathology plus a healthy one.

Run from the repository root, either way:

    python -m tests.scenarios.generate_samples [NAME ...]
    python tests/scenarios/generate_samples.py [NAME ...]

Each sample is recorded by the same scenario function the tests use (tests/scenarios/
scenarios.py), then analysed; a sample whose findings do not match ``SAMPLES[name].expect``
(e.g. the healthy run caught a stall because the machine was busy) is recorded again, up to
three times, so the committed runs show what sample_traces/README.md says they show.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `tests.scenarios` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.scenarios import scenarios as S

OUT = S.REPO_ROOT / "sample_traces"
SIZE_BUDGET_BYTES = 10 * 1024 * 1024


@dataclass(frozen=True)
class Sample:
    """One committed run: how to record it and what the analyzer must say about it."""

    record: Callable[..., Path]
    kwargs: dict[str, Any]
    expect: dict[str, str | None]
    """finding id -> expected subject (None: any subject), each above info."""
    about: str
    allow: frozenset[str] = field(default_factory=frozenset)
    """other findings above info that may appear (side effects of the pathology)."""


SAMPLES: dict[str, Sample] = {
    "healthy": Sample(
        S.run_healthy, {"steps": 300, "profile_start": 50},
        {}, "MLP on a teacher task, Adam lr 1e-3, standard preset with one torch.profiler "
            "window (steps 50-51, trace under traces/rank=0/)."),
    "memory_leak": Sample(
        S.run_leak_loss_history, {"steps": 200},
        {"memory_leak": "heap_bytes"},  # malloc in use: the leak without allocator caching
        f"From step {S.LEAK_STEP} a validation loss computed without torch.no_grad() is "
        "appended to a list every step: each entry keeps its autograd graph alive."),
    "exploding_gradients": Sample(
        S.run_high_lr, {"steps": 200},
        {"gradient_explosion": None, "nonfinite": None, "loss_divergence": "loss"},
        f"Tanh regression MLP with SGD; the learning rate jumps 80x at step "
        f"{S.LR_JUMP_STEP}. Gradients grow geometrically, overflow, the loss turns NaN.",
        allow=frozenset({"loss_spike", "dataloader_bottleneck", "step_time_outlier"})),
    "nan_in_module": Sample(
        S.run_nan_in_module, {"steps": 150},
        {"nonfinite": S.NAN_MODULE},
        f"Debug preset (per-module NaN tracing). The output of {S.NAN_MODULE} is poisoned "
        f"with one NaN at step {S.NAN_STEP}; training goes on with NaN (so the loss "
        "ends NaN: loss_divergence too).",
        allow=frozenset({"loss_divergence", "loss_plateau"})),
    "vanishing_gradients": Sample(
        S.run_vanishing, {"steps": 200},
        {"vanishing_gradient": None},
        "20 Linear+Sigmoid layers, default init, SGD: the first layers get ~4^-20 of the "
        "last layer's gradient and the loss never moves.",
        allow=frozenset({"loss_plateau"})),
    "slow_dataloader": Sample(
        S.run_slow_dataloader, {"steps": 120},
        {"dataloader_bottleneck": "dataloader"},
        "Each batch takes 20 ms to load in the main process (num_workers=0), several times "
        "the step's compute."),
    "frozen_optimizer": Sample(
        S.run_frozen_lr0, {"steps": 200, "preset": "debug"},
        {"loss_plateau": "loss", "update_ratio": None},
        "Adam with lr=0 (debug preset, so update ratios are recorded): nothing moves."),
    "loss_spike": Sample(
        S.run_loss_spike, {"steps": 260},
        {"loss_spike": "loss"},
        f"A batch with scrambled labels and scaled inputs at step {S.SPIKE_STEPS[0]}."),
    "crashed": Sample(
        S.run_crash, {"steps": 200},
        {"training_crashed": "SimulatedFailure"},
        f"An exception leaves the training loop at step {S.CRASH_STEP}; status crashed, the "
        "exception and its stack are in the events table."),
    "killed": Sample(
        S.run_killed, {"min_steps": 100},
        {"training_crashed": "rank 0"},
        "The training process was killed with SIGKILL after ~100 steps: run.json still says "
        "running; its heartbeat is long stale, so the analyzer reports it killed.",
        allow=frozenset({"step_time_outlier", "loss_plateau"})),
    "straggler": Sample(
        S.run_straggler, {"steps": 200},
        {"straggler": f"rank {S.STRAGGLER_RANK}"},
        f"Two ranks (RANK/WORLD_SIZE set) write one run directory; rank "
        f"{S.STRAGGLER_RANK} sleeps 10 ms every step."),
}

# Knobs every sample shares: parts merged at close (one file per table and rank), the
# system sampler at its 1 s default.
SAMPLE_KNOBS: dict[str, Any] = {"merge_on_close": True, "system_interval_s": 1.0}


def check(name: str, run_dir: Path, *, killed_stale_s: float | None = None) -> list[str]:
    """What is wrong with the sample's findings (empty when they match its expectation)."""
    from tests.scenarios import checks

    sample = SAMPLES[name]
    overrides = ({"training_crashed": {"stale_after_s": killed_stale_s}}
                 if killed_stale_s is not None else None)
    summary = checks.summarize(run_dir, overrides)
    problems = []
    for fid, subject in sample.expect.items():
        found = [f for f in checks.above(summary) if f["id"] == fid]
        if not found:
            problems.append(f"no {fid} finding above info")
        elif subject is not None and found[0]["subject"] != subject:
            problems.append(f"{fid} subject {found[0]['subject']!r} != {subject!r}")
    extra = checks.unexpected(summary, run_dir, set(sample.expect) | sample.allow)
    # committed samples must be clean even on a busy machine: no timing excuses here
    extra += [f for f in checks.above(summary) if f["id"] in checks.TIMING_IDS
              and f["id"] not in set(sample.expect) | sample.allow and f not in extra]
    problems += [f"unexpected {f['id']} ({f['severity']}): {f['title']}" for f in extra]
    return problems


def record(name: str, out: Path = OUT, attempts: int = 3) -> Path:
    sample = SAMPLES[name]
    run_dir = out / name
    for attempt in range(1, attempts + 1):
        if run_dir.exists():
            shutil.rmtree(run_dir)
        kwargs = dict(sample.kwargs)
        if sample.record not in (S.run_straggler, S.run_killed):
            kwargs.update(SAMPLE_KNOBS)
        t0 = time.monotonic()
        sample.record(run_dir, **kwargs)
        # a killed run is judged as it will be read later, with a stale heartbeat
        problems = check(name, run_dir,
                         killed_stale_s=0.001 if sample.record is S.run_killed else None)
        print(f"{name}: recorded in {time.monotonic() - t0:.1f}s, "
              f"{'ok' if not problems else '; '.join(problems)}", flush=True)
        if not problems:
            return run_dir
        if attempt < attempts:
            print(f"{name}: recording again ({attempt}/{attempts})", flush=True)
    raise SystemExit(f"{name}: the recorded run does not show what it should: {problems}")


def size_of(path: Path) -> int:
    """Bytes of the files committed for a sample (report.html files are gitignored)."""
    return sum(p.stat().st_size for p in path.rglob("*")
               if p.is_file() and p.name != "report.html")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", metavar="NAME",
                    help=f"samples to record (default all): {', '.join(SAMPLES)}")
    ap.add_argument("--out", type=Path, default=OUT, help="output folder (sample_traces/)")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.names) - set(SAMPLES))
    if unknown:
        ap.error(f"unknown sample(s) {', '.join(unknown)}; choose from {', '.join(SAMPLES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names or list(SAMPLES):
        record(name, args.out)
    total = sum(size_of(args.out / n) for n in SAMPLES if (args.out / n).exists())
    print(f"sample_traces: {total / 1e6:.2f} MB in all (budget {SIZE_BUDGET_BYTES / 1e6:.1f})")
    if total > SIZE_BUDGET_BYTES:
        print("over budget: reduce steps or statistics cadences", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
