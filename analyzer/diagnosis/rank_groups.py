"""Per-rank findings folded for jobs with many ranks.

A detector that judges each rank on its own (gpu_idle, host_sync) says the same thing once
per rank: on a 1,024-rank job that is 1,024 findings nobody reads. Past ``limit`` findings,
each severity keeps one: the rank where it is worst (by the detector's ``RANK_KEY``
evidence value), its title and message saying on which other ranks the same holds, and
``evidence.ranks`` / ``evidence.by_rank`` listing them all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from .findings import Finding

LIMIT = 8
"""Per-rank findings of one detector (and per-rank lines of the text summary) shown before
they are folded."""


def rank_ranges(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 6, 8, 9]`` → ``'0–3, 6, 8–9'``."""
    out: list[str] = []
    run: list[int] = []
    for r in sorted(set(ranks)):
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}–{run[-1]}")
        run = [r]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}–{run[-1]}")
    return ", ".join(out)


def _rank(f: Finding) -> int | None:
    r = f.evidence.get("rank") if isinstance(f.evidence, dict) else None
    return r if isinstance(r, int) else None


def fold_per_rank(found: list[Finding], key: str | None, limit: int = LIMIT) -> list[Finding]:
    """``found`` with its per-rank findings folded, one per severity, when there are more
    than ``limit`` of them; unchanged otherwise."""
    per_rank = [f for f in found if _rank(f) is not None]
    if len(per_rank) <= limit:
        return found
    rest = [f for f in found if _rank(f) is None]
    by_sev: dict[str, list[Finding]] = {}
    for f in per_rank:
        by_sev.setdefault(f.severity, []).append(f)
    def value(f: Finding) -> float:
        v = f.evidence.get(key) if key else None
        return float(v) if isinstance(v, (int, float)) else 0.0

    folded = []
    for group in by_sev.values():
        worst = max(group, key=value)
        others = [f for f in group if f is not worst]
        if not others:
            folded.append(worst)
            continue
        ranks = [_rank(f) for f in group]
        values = [value(f) for f in others]
        span = (f" ({key} {min(values):g}–{max(values):g})" if key else "")
        evidence: dict[str, Any] = {**worst.evidence, "ranks": sorted(ranks)}
        if key:
            evidence["by_rank"] = {str(_rank(f)): value(f) for f in group}
        folded.append(dataclasses.replace(
            worst, title=f"{worst.title} (and {len(others)} more ranks)",
            message=f"{worst.message} The same on {len(others)} other ranks: "
                    f"{rank_ranges(_rank(f) for f in others)}{span}.",
            evidence=evidence))
    return rest + folded
