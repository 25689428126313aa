"""Robust statistics shared by the detectors (numpy only; no scipy at run time)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

MAD_TO_SIGMA = 1.4826
"""MAD × this estimates σ for normal data."""


def mad_sigma(x: np.ndarray) -> float:
    """Robust σ: 1.4826 × median absolute deviation (0 for fewer than 2 values)."""
    x = x[np.isfinite(x)]
    if len(x) < 2:
        return 0.0
    return float(MAD_TO_SIGMA * np.median(np.abs(x - np.median(x))))


def rolling_median(x: np.ndarray, window: int) -> np.ndarray:
    """Centred rolling median (window made odd; edges use the shrunken window)."""
    n = len(x)
    w = max(1, int(window)) | 1
    if n == 0 or w == 1:
        return x.astype(np.float64, copy=True)
    h = w // 2
    padded = np.concatenate([np.full(h, np.nan), x.astype(np.float64), np.full(h, np.nan)])
    view = np.lib.stride_tricks.sliding_window_view(padded, w)
    return nanmedian(view, axis=1)


def _quiet(fn: Any, a: np.ndarray, axis: int) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    empty = np.all(np.isnan(a), axis=axis)
    if not np.any(empty):
        return fn(a, axis=axis)
    out = np.asarray(fn(np.where(np.expand_dims(empty, axis), 0.0, a), axis=axis),
                     dtype=np.float64)
    out[empty] = np.nan
    return out


def nanmedian(a: np.ndarray, axis: int) -> np.ndarray:
    """``np.nanmedian`` along ``axis`` (the same values), where an all-NaN slice gives NaN
    *without* numpy's RuntimeWarning (``warnings.catch_warnings()`` swaps the process-wide
    filters and is not thread-safe: compare reads two runs in parallel threads).

    One sort along the axis (NaN sorts last) and the middle of each slice's non-NaN count:
    numpy's own nanmedian takes a masked-array path per call on small slices, 40x slower,
    which made the detectors' per-tensor rolling medians most of a run's analysis."""
    a = np.asarray(a, dtype=np.float64)
    s = np.sort(a, axis=axis)
    n = np.sum(~np.isnan(a), axis=axis, keepdims=True)
    lo = np.take_along_axis(s, np.maximum(n - 1, 0) // 2, axis=axis)
    hi = np.take_along_axis(s, np.maximum(n, 1) // 2 - (n == 0), axis=axis)
    with np.errstate(over="ignore", invalid="ignore"):  # (as numpy's mean of the two)
        mid = np.where(lo == hi, lo, 0.5 * (lo + hi))
    out = np.squeeze(mid, axis=axis)
    return np.where(np.squeeze(n, axis=axis) == 0, np.nan, out)


def nanmax(a: np.ndarray, axis: int) -> np.ndarray:
    """``np.nanmax`` with the all-NaN handling of :func:`nanmedian`."""
    return _quiet(np.nanmax, a, axis)


def theil_sen(x: np.ndarray, y: np.ndarray, max_points: int = 400) -> tuple[float, float]:
    """Theil–Sen slope and intercept of y over x (subsampled to ``max_points`` evenly)."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok].astype(np.float64), y[ok].astype(np.float64)
    if len(x) > max_points:
        idx = np.linspace(0, len(x) - 1, max_points).astype(int)
        x, y = x[idx], y[idx]
    if len(x) < 2:
        return 0.0, float(y[0]) if len(y) else 0.0
    i, j = np.triu_indices(len(x), 1)
    dx = x[j] - x[i]
    keep = dx != 0
    if not keep.any():
        return 0.0, float(np.median(y))
    slope = float(np.median((y[j] - y[i])[keep] / dx[keep]))
    return slope, float(np.median(y - slope * x))


def mann_kendall(y: np.ndarray, max_points: int = 400) -> tuple[float, float]:
    """Mann–Kendall trend test: (z, two-sided p). z > 0 rising, z < 0 falling."""
    y = y[np.isfinite(y)].astype(np.float64)
    if len(y) > max_points:
        y = y[np.linspace(0, len(y) - 1, max_points).astype(int)]
    n = len(y)
    if n < 3:
        return 0.0, 1.0
    i, j = np.triu_indices(n, 1)
    s = float(np.sign(y[j] - y[i]).sum())
    var = n * (n - 1) * (2 * n + 5) / 18.0
    if var <= 0:
        return 0.0, 1.0
    z = (s - math.copysign(1.0, s)) / math.sqrt(var) if s != 0 else 0.0
    p = math.erfc(abs(z) / math.sqrt(2.0))
    return z, p


def bucket_series(x: np.ndarray, y: np.ndarray, buckets: int, how: str = "min"
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Reduce (x, y) to ≤ ``buckets`` points: x = bucket's first x, y = min/median per bucket."""
    n = len(x)
    if n == 0:
        return x, y
    edges = np.linspace(0, n, min(buckets, n) + 1).astype(int)
    xs, ys = [], []
    for a, b in itertools.pairwise(edges):
        if b <= a:
            continue
        seg = y[a:b]
        seg = seg[np.isfinite(seg)]
        if not len(seg):
            continue
        xs.append(x[a])
        ys.append(seg.min() if how == "min" else np.median(seg))
    return np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)


def stands_apart(cands: np.ndarray, sizes: np.ndarray, floor: float, factor: float
                 ) -> np.ndarray:
    """For each candidate size, whether it stands ``factor`` times beyond the series' own
    tail: the sizes from it down to ``floor`` (the largest ordinary value), sorted, break
    somewhere by ``factor`` between consecutive values. A heavy tail (lognormal, Pareto)
    runs on in steps of a few times among its largest draws; an accident (a corrupt batch,
    a stall) sits orders beyond them. Candidates are among ``sizes``; all are > 0 here."""
    cands = np.asarray(cands, dtype=np.float64)
    floor = max(float(floor), 1e-12)
    s = np.sort(np.asarray(sizes, dtype=np.float64))[::-1]
    s = np.concatenate([s[np.isfinite(s) & (s >= floor)], [floor]])
    brk = s[:-1] >= factor * np.maximum(s[1:], 1e-12)
    if not brk.any():
        return np.zeros(len(cands), dtype=bool)
    return cands >= float(np.min(s[:-1][brk]))  # (a break at or below the candidate)
