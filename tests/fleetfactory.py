"""A synthetic fleet: many runs with realistic shapes, some with a pathology, and some
hosts made slow on purpose (every rank placed on them computes slower). Used by the fleet
tests (small) and ``benchmarks/fleet.py`` (realistic sizes)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tests.runfactory import make_run

PATHOLOGIES = ("leak", "nan", "explosion", "crashed", "slow_data")


@dataclass
class FleetSpec:
    runs: int = 20
    min_steps: int = 1_000
    max_steps: int = 100_000
    rank_choices: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    rank_weights: tuple[float, ...] = (0.3, 0.2, 0.15, 0.15, 0.1, 0.06, 0.04)
    min_tensors: int = 20
    max_tensors: int = 400
    tensor_every: int = 100
    """The recorder's default ``tensor_stats_every``."""
    hosts: int = 64
    slow_hosts: tuple[str, ...] = ("node-007", "node-031")
    slowdown: float = 0.3
    pathology_share: float = 0.1
    days: int = 30
    seed: int = 0
    made: list[dict[str, Any]] = field(default_factory=list)
    """What was generated: one dict per run (path, ranks, hosts, pathology)."""


def _placement(rng: np.random.Generator, ranks: int, spec: FleetSpec) -> dict[int, str]:
    """Ranks packed per host (1, 2, 4 or 8 a host, as GPUs per node), on distinct hosts."""
    per = int(rng.choice([p for p in (1, 2, 4, 8) if p <= ranks] or [1]))
    n_hosts = max(1, ranks // per)
    chosen = rng.choice(spec.hosts, size=min(n_hosts, spec.hosts), replace=False)
    return {r: f"node-{int(chosen[min(r // per, len(chosen) - 1)]):03d}" for r in range(ranks)}


def make_run_of_fleet(root: Path, i: int, spec: FleetSpec) -> dict[str, Any]:
    rng = np.random.default_rng([spec.seed, i])
    ranks = int(rng.choice(spec.rank_choices, p=np.asarray(spec.rank_weights)
                           / np.sum(spec.rank_weights)))
    steps = int(np.exp(rng.uniform(np.log(spec.min_steps), np.log(spec.max_steps))))
    tensors = int(rng.integers(spec.min_tensors, spec.max_tensors + 1))
    hosts = _placement(rng, ranks, spec)
    sick = rng.random() < spec.pathology_share
    what = str(rng.choice(PATHOLOGIES)) if sick else None
    step_time = float(rng.uniform(0.05, 0.5))
    noise_seed = int(rng.integers(1 << 30))

    def duration_of(rank: int) -> Any:
        slow = 1 + spec.slowdown if hosts[rank] in spec.slow_hosts else 1.0
        r = np.random.default_rng([noise_seed, rank])
        return lambda s: step_time * slow * (1 + 0.03 * np.abs(r.normal(size=len(s))))

    kw: dict[str, Any] = {}
    onset = steps // 2
    if what == "leak":
        kw["rss"] = lambda s: 2e9 + 4e6 * s / max(1, steps / 1000)
    elif what == "nan":
        kw["loss"] = lambda s: np.where(s < onset, 2.0 * np.exp(-s / steps) + 0.3, np.nan)
        kw["nonfinite_grads"] = lambda s: np.where(s < onset, 0, 3)
    elif what == "explosion":
        kw["grad_norm"] = lambda s: np.where(s < onset, 1.0, 10 ** ((s - onset) / (steps / 8)))
    elif what == "crashed":
        kw["status"] = "crashed"
        kw["events"] = [{"kind": "exception", "severity": "critical", "step": steps - 1,
                         "message": "RuntimeError: CUDA error: an illegal memory access"}]
    elif what == "slow_data":
        kw["data_wait"] = lambda s: np.full(len(s), 0.7 * step_time)
    started = time.time() - float(rng.uniform(0, spec.days * 86400))
    path = make_run(root, name=f"team{i % 7}/exp-{i:05d}", steps=steps, ranks=ranks,
                    seed=noise_seed, step_time=step_time, tensors=tensors,
                    tensor_every=spec.tensor_every, hosts=hosts, tensor_ranks=(0,),
                    duration={r: duration_of(r) for r in range(ranks)},
                    memory_every=10, run_meta={"started": started,
                                               "ended": started + steps * step_time}, **kw)
    made = {"path": str(path), "ranks": ranks, "steps": steps, "tensors": tensors,
            "hosts": sorted(set(hosts.values())), "pathology": what}
    spec.made.append(made)
    return made


def make_fleet(root: Path, spec: FleetSpec) -> FleetSpec:
    for i in range(spec.runs):
        make_run_of_fleet(root, i, spec)
    return spec
