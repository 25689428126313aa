"""``suspect_host``: the machine that makes the jobs it joins slow, seen across runs.

One run cannot tell a slow node from a slow shard or bad luck; many runs can. In each run
spread over two hosts or more, the **slow rank** is the rank the run's ``straggler``
finding names, else the rank whose median compute time (batch arrival to last gradient;
the step time where compute is not recorded) is the highest, if it is at least
``MIN_SLOWDOWN`` above the median of the other ranks. Under the null hypothesis that hosts
are alike, the slow rank of a run is any of its ranks with equal chance, so a host holding
``m`` of a run's ``w`` ranks is expected to hold the slow rank ``m / w`` of the time. A host
is named when it held the slow rank in at least ``MIN_RUNS`` runs, significantly more often
than that expectation (exact Poisson-binomial tail, p below ``ALPHA`` divided by the number
of hosts tested: Bonferroni), and at least ``MIN_RATE_RATIO`` times as often per run as its
peers (an effect, not only a p-value). Runs on one host carry no information about hosts
and are not counted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

ID = "suspect_host"
MIN_SLOWDOWN = 0.05
"""A rank this much slower than the others' median (5%) is its run's slow rank: below it,
the difference is within the spread of healthy ranks' compute times on one job."""
MIN_RUNS = 3
"""Evidence from fewer runs is an anecdote: one bad job can hit any host twice."""
ALPHA = 0.01
"""Family-wise false-alarm rate over all hosts of the fleet (Bonferroni)."""
MIN_RATE_RATIO = 2.0
"""Slow in at least twice the share of its runs as its peers are in theirs."""


def _slow_rank(ranks: list[dict[str, Any]]) -> tuple[int, float] | None:
    """The run's slow rank and how much slower it is than the others' median (or None)."""
    for r in ranks:
        if r.get("straggler"):
            return r["rank"], _slowdown(ranks, r["rank"])
    col = "median_compute_s" if all(r.get("median_compute_s") for r in ranks) \
        else "median_step_s"
    vals = [(r.get(col), r["rank"]) for r in ranks if r.get(col)]
    if len(vals) < 2:
        return None
    _, rank = max(vals)
    slow = _slowdown(ranks, rank, col)
    return (rank, slow) if slow >= MIN_SLOWDOWN else None


def _slowdown(ranks: list[dict[str, Any]], rank: int, col: str = "") -> float:
    col = col or ("median_compute_s" if all(r.get("median_compute_s") for r in ranks)
                  else "median_step_s")
    mine = next((r.get(col) for r in ranks if r["rank"] == rank), None)
    others = [r.get(col) for r in ranks if r["rank"] != rank and r.get(col)]
    if not mine or not others:
        return 0.0
    return float(mine / np.median(others) - 1.0)


def tail_p(probs: Sequence[float], k: int) -> float:
    """P(K ≥ k) for K the number of successes of independent trials with ``probs``
    (Poisson-binomial, exact by dynamic programming)."""
    dist = np.zeros(len(probs) + 1)
    dist[0] = 1.0
    for i, p in enumerate(probs, start=1):
        dist[1:i + 1] = dist[1:i + 1] * (1 - p) + dist[:i] * p
        dist[0] *= 1 - p
    return float(min(1.0, dist[k:].sum()))


def suspect_hosts(ranks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``suspect_host`` fleet findings from the index's ``ranks`` rows, worst first."""
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in ranks:
        if r.get("host"):
            by_run[r["path"]].append(r)
    took_part: dict[str, list[float]] = defaultdict(list)  # host -> p per run with a slow rank
    runs_of: dict[str, int] = defaultdict(int)
    slow_in: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path, rs in by_run.items():
        hosts = [r["host"] for r in rs]
        if len(set(hosts)) < 2:
            continue
        for h in set(hosts):
            runs_of[h] += 1
        slow = _slow_rank(rs)
        if slow is None:
            continue
        rank, by = slow
        for h in set(hosts):
            took_part[h].append(hosts.count(h) / len(hosts))
        host = next(r["host"] for r in rs if r["rank"] == rank)
        slow_in[host].append({"run_id": rs[0].get("run_id"), "path": path, "rank": rank,
                              "slowdown": round(by, 4)})
    tested = len(runs_of)
    out = []
    for h, per_run in slow_in.items():
        k, n = len(per_run), runs_of[h]
        peers_k = sum(len(v) for g, v in slow_in.items() if g != h)
        peers_n = sum(c for g, c in runs_of.items() if g != h)
        rate, peers_rate = k / n, (peers_k / peers_n if peers_n else 0.0)
        p = tail_p(took_part[h], k)
        if k < MIN_RUNS or p > ALPHA / max(tested, 1) or rate < MIN_RATE_RATIO * peers_rate:
            continue
        expected = float(sum(took_part[h]))
        med = float(np.median([x["slowdown"] for x in per_run]))
        out.append({
            "id": ID, "severity": "warning", "subject": h,
            "title": f"Host {h} was the slow rank in {k} of the {n} runs it took part in",
            "message": (f"{h} held the slowest rank in {k} of {n} multi-host runs "
                        f"({100 * rate:.0f}%, against {100 * peers_rate:.0f}% for the other "
                        f"hosts; {expected:.1f} expected by its share of ranks, p = {p:.2g}); "
                        f"its rank was {100 * med:.0f}% slower than the others' median."),
            "advice": "Drain the host and check its GPUs (clocks, thermal throttling, ECC "
                      "errors), NICs and other tenants before it slows more jobs.",
            "evidence": {"runs": n, "slow_runs": k, "expected": round(expected, 2),
                         "p_value": p, "rate": rate, "peers_rate": peers_rate,
                         "median_slowdown": med, "per_run": per_run[:50]},
        })
    return sorted(out, key=lambda f: f["evidence"]["p_value"])
