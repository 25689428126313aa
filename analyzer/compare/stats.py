"""When is a difference between two runs real? Against the runs' own step-to-step noise.

A metric computed from per-step samples (step times, data-wait shares, late losses, gradient
norms) changed **significantly** when both hold:

* a two-sided Mann–Whitney U test of the two sample sets (normal approximation with tie
  correction) gives p < ``ALPHA`` (0.01) — the shift is not chance; and
* the shift of the medians is at least ``MIN_EFFECT`` (0.5) pooled robust standard deviations
  (1.4826 · MAD) — it is large next to the samples' own spread (thousands of samples make any
  drift "significant" to the test alone).

Step-time figures are judged on the medians of 20 consecutive blocks of each run's steps
(:func:`block_medians`), and need ``MIN_EFFECT_BLOCKS`` (2) pooled σ of those: the spread of
the blocks is the machine's own drift during a run, and two identical runs on a shared
machine differ by about that much (measured here: ±10% between consecutive runs, 1.4 σ at
most), while the step-to-step jitter of a steady loop is far smaller.

No scipy: the test is a few lines of numpy. Samples are thinned evenly to at most
``MAX_SAMPLES`` (the test is O(n log n) anyway; this bounds memory on 100k-step runs).
"""

from __future__ import annotations

import math

import numpy as np

ALPHA = 0.01
MIN_EFFECT = 0.5
MAX_SAMPLES = 20_000
BLOCKS = 20
MIN_EFFECT_BLOCKS = 2.0
TEST = (f"Mann-Whitney U p < {ALPHA} and |Δ median| ≥ {MIN_EFFECT} pooled robust σ of the "
        f"per-step values ({MIN_EFFECT_BLOCKS:g} σ of {BLOCKS}-block medians for step times)")


def thin(x: np.ndarray, n: int = MAX_SAMPLES) -> np.ndarray:
    x = x[np.isfinite(x)]
    if len(x) <= n:
        return x
    return x[np.linspace(0, len(x) - 1, n).astype(np.int64)]


def mann_whitney_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value of the Mann–Whitney U test (normal approximation, tie-corrected)."""
    n1, n2 = len(a), len(b)
    if n1 < 3 or n2 < 3:
        return 1.0
    both = np.concatenate([a, b])
    order = np.argsort(both, kind="mergesort")
    ranks = np.empty(len(both), dtype=np.float64)
    ranks[order] = np.arange(1, len(both) + 1)
    # average ranks of ties
    values = both[order]
    _, start, counts = np.unique(values, return_index=True, return_counts=True)
    tie_term = 0.0
    for s, c in zip(start[counts > 1], counts[counts > 1], strict=True):
        ranks[order[s:s + c]] = s + (c + 1) / 2.0
        tie_term += c ** 3 - c
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2.0
    mu = n1 * n2 / 2.0
    n = n1 + n2
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (abs(u1 - mu) - 0.5) / math.sqrt(var)
    return float(math.erfc(max(z, 0.0) / math.sqrt(2.0)))


def block_medians(x: np.ndarray, blocks: int = BLOCKS) -> np.ndarray:
    """Medians of ``blocks`` consecutive, equal runs of steps (for step-time figures): what
    varies between them is the machine's own drift during the run (other jobs, clocks,
    thermal), which a change must exceed, not just the step-to-step jitter, which is tiny
    on a steady loop and would make a 3% drift between two identical runs "significant"."""
    x = x[np.isfinite(x)]
    if len(x) < 3 * blocks:
        return x
    return np.array([np.median(c) for c in np.array_split(x, blocks)])


def robust_sigma(x: np.ndarray) -> float:
    return float(1.4826 * np.median(np.abs(x - np.median(x)))) if len(x) else 0.0


def shifted(a: np.ndarray, b: np.ndarray, min_effect: float = MIN_EFFECT
            ) -> tuple[bool, dict[str, float]]:
    """Whether the samples ``b`` differ from ``a`` beyond their noise, and the evidence."""
    a, b = thin(np.asarray(a, dtype=np.float64)), thin(np.asarray(b, dtype=np.float64))
    if len(a) < 3 or len(b) < 3:
        return False, {"p_value": 1.0, "effect": 0.0}
    p = mann_whitney_p(a, b)
    pooled = math.sqrt((robust_sigma(a) ** 2 + robust_sigma(b) ** 2) / 2.0)
    delta = float(np.median(b) - np.median(a))
    # (constant samples: any difference of the medians is real)
    effect = abs(delta) / pooled if pooled > 0 else (math.inf if delta else 0.0)
    return (p < ALPHA and effect >= min_effect), {"p_value": p, "effect": effect}


def two_proportion_p(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p-value that k1/n1 and k2/n2 (e.g. outlier steps) share one rate (pooled
    normal approximation)."""
    if n1 <= 0 or n2 <= 0:
        return 1.0
    pooled = (k1 + k2) / (n1 + n2)
    var = pooled * (1 - pooled) * (1 / n1 + 1 / n2)
    if var <= 0:
        return 1.0
    z = abs(k1 / n1 - k2 / n2) / math.sqrt(var)
    return float(math.erfc(z / math.sqrt(2.0)))
