"""The fixed bins of the ``histograms`` table, shared by every tensor and every step.

Weights, gradients and updates span many orders of magnitude (a gradient of 1e-9 next to
one of 10), so the bins are log-spaced in magnitude, on both signs, with a bin for exact
zeros: ``PER_DECADE`` bins per decade from ``10**LO_EXP`` to ``10**HI_EXP``. Every tensor
and every step uses the same bins, so any two histograms line up (a sum over a layer's
tensors, one step against another, one run against another).

Bin ``b`` of ``NBINS`` (values increase with ``b``)::

    0                  x <= -10**HI_EXP (and -inf)
    1 .. K             negative, |x| in [10**(LO_EXP+(K-b)/3), 10**(LO_EXP+(K-b+1)/3))
    K+1                -10**LO_EXP < x < 0      (negative underflow)
    K+2                x == 0
    K+3                0 < x < 10**LO_EXP       (positive underflow)
    K+4 .. 2K+3        positive, x in [10**(LO_EXP+(b-K-4)/3), 10**(LO_EXP+(b-K-3)/3))
    2K+4               x >= 10**HI_EXP (and +inf)

with ``K = (HI_EXP - LO_EXP) * PER_DECADE``. NaN is in no bin: a row's ``nonfinite`` counts
it (numel minus the bins' sum). The recorder computes the bin in float32 (``log10``), so a
value within float32 rounding of an edge may land on either side of it.
"""

from __future__ import annotations

import math

LO_EXP = -12
"""Smallest magnitude with bins of its own: 1e-12 (below: the underflow bins)."""
HI_EXP = 6
"""Largest: 1e6 (at or above: the overflow bins)."""
PER_DECADE = 3
K = (HI_EXP - LO_EXP) * PER_DECADE
NBINS = 2 * K + 5
ZERO_BIN = K + 2


def bin_edges(b: int) -> tuple[float, float]:
    """(lower, upper) of bin ``b``: lower inclusive for positive bins, upper inclusive for
    negative ones (``-inf``/``inf`` at the ends; ``(0, 0)`` for the zero bin)."""
    if not 0 <= b < NBINS:
        raise ValueError(f"bin {b} outside 0..{NBINS - 1}")
    top = 10.0 ** HI_EXP
    low = 10.0 ** LO_EXP
    if b == 0:
        return -math.inf, -top
    if b == 2 * K + 4:
        return top, math.inf
    if b == ZERO_BIN:
        return 0.0, 0.0
    if b == K + 1:
        return -low, 0.0
    if b == K + 3:
        return 0.0, low
    if b > ZERO_BIN:
        j = b - (K + 4)
        return 10.0 ** (LO_EXP + j / PER_DECADE), 10.0 ** (LO_EXP + (j + 1) / PER_DECADE)
    lo, hi = bin_edges(2 * K + 4 - b)
    return -hi, -lo


def bin_of(x: float) -> int | None:
    """The bin of one value, in float64 (the reference the tests hold the recorder's
    float32 kernels to); None for NaN."""
    if x != x:
        return None
    if x == 0:
        return ZERO_BIN
    t = math.floor((math.log10(abs(x)) - LO_EXP) * PER_DECADE) if math.isfinite(x) else K
    t = min(max(t, -1), K)
    return int(math.copysign(t + 2, x)) + K + 2
