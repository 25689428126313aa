"""Which streams of a many-rank job are unusually idle, on which ranks, and why.

The idle breakdown is one row per rank × stream: 64 ranks with 4 streams is 256 rows, and the
one that matters is lost among them. A stream id means the same on every rank of a job (the
compute stream, the NCCL streams), so each (rank, stream) is compared with the same stream on
the other ranks:

* its idle share: the stream's idle time (host wait + kernel wait + other) over the rank's
  GPU time (``total_us``);
* unusual: more than ``MIN_EXCESS`` (5 percentage points of GPU time) *and* more than 3
  robust standard deviations (1.4826 × the median absolute deviation) above the stream's
  median share over the ranks. Less idle than its peers is never a problem; a stream seen
  on fewer than ``MIN_RANKS`` ranks has no peers to be compared with;
* why: the kind of idle time (host wait, kernel wait, other) whose share rose most above its
  own median on the other ranks.

Unusual (rank, stream) pairs with the same stream and cause are grouped by rank, and the
streams whose groups hold the same ranks for the same cause are one line (a host-bound
rank starves every stream it feeds).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

MIN_EXCESS = 0.05
"""Smallest excess idle share (of the rank's GPU time) worth a line."""
MIN_RANKS = 4
"""Ranks a stream must appear on to have a median to be compared with."""
CAUSES = {
    "host_wait_us": ("host wait", "the host launched work late (CPU-bound step: data "
                                  "loading, Python overhead, a host sync)"),
    "kernel_wait_us": ("kernel wait", "short gaps between back-to-back kernels (launch "
                                      "overhead of many small kernels: CUDA graphs, "
                                      "torch.compile)"),
    "other_us": ("other", "the stream waited on something else (another stream's event, a "
                          "collective held up by a slower rank)"),
}


def _robust_sd(xs: Sequence[float]) -> float:
    m = statistics.median(xs)
    return 1.4826 * statistics.median(abs(x - m) for x in xs)


def unusual_streams(gpu: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Groups ``{"streams", "ranks", "share", "peer_share", "cause", "cause_share",
    "peer_cause_share", "why"}`` (shares as fractions of GPU time; ``share``: the median
    over the group's rank × stream pairs, ``peer_share``: of the streams' medians over all
    ranks), largest excess first. ``gpu``: the ``gpu_time`` rows of the summary."""
    shares: dict[int, dict[int, dict[str, float]]] = defaultdict(dict)
    for g in gpu:
        total = g.get("total_us") or 0
        if total <= 0:
            continue
        for s in g.get("idle_breakdown") or []:
            parts = {k: max(float(s.get(k) or 0.0), 0.0) / total for k in CAUSES}
            parts["idle"] = sum(parts.values())
            shares[int(s["stream"])][int(g["rank"])] = parts
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    medians: dict[int, dict[str, float]] = {}
    for stream, by_rank in shares.items():
        if len(by_rank) < MIN_RANKS:
            continue
        med = {k: statistics.median(p[k] for p in by_rank.values()) for k in (*CAUSES, "idle")}
        medians[stream] = med
        bar = max(MIN_EXCESS, 3 * _robust_sd([p["idle"] for p in by_rank.values()]))
        for rank, p in by_rank.items():
            if p["idle"] - med["idle"] > bar:
                cause = max(CAUSES, key=lambda k, p=p, med=med: p[k] - med[k])
                groups[(stream, cause)].append(rank)
    # one group per (ranks, cause): a host-bound rank starves all of its streams alike
    merged: dict[tuple[tuple[int, ...], str], list[int]] = defaultdict(list)
    for (stream, cause), ranks in groups.items():
        merged[(tuple(sorted(ranks)), cause)].append(stream)
    out = []
    for (ranks, cause), streams in merged.items():
        rows = [shares[s][r] for s in streams for r in ranks]
        out.append({
            "streams": sorted(streams), "ranks": list(ranks),
            "share": statistics.median(p["idle"] for p in rows),
            "peer_share": statistics.median(medians[s]["idle"] for s in streams),
            "cause": CAUSES[cause][0],
            "cause_share": statistics.median(p[cause] for p in rows),
            "peer_cause_share": statistics.median(medians[s][cause] for s in streams),
            "why": CAUSES[cause][1],
        })
    out.sort(key=lambda g: (-(g["share"] - g["peer_share"]), g["streams"]))
    return out
