"""Full statistics of CPU tensors: the host path of :class:`stats.FullStats`.

On an accelerator the grouped path (stack same-size tensors, one reduction per statistic per
group) is right: a few kernel launches however many tensors. On the CPU it is ~10x slower
than it needs to be: stacking copies every tensor, ``var_mean`` is a Welford pass several
times slower than a plain sum, and ``(x == 0).sum()`` / ``isfinite(x).sum()`` materialise a
bool tensor and then widen it. Measured single-threaded on 192 tensors / 3.2M values: 102 ms
grouped, ~8 ms here.

This path works per tensor (a loop over tensors, never over elements) with the cheapest
reduction for each statistic: ``vector_norm``, ``sum``, ``aminmax`` and ``count_nonzero``
each read the values once without temporaries. Reading a result on the host (``float()``)
costs nothing here: a CPU tensor has no device to wait for, so the path may look at values
to skip work:

* the nonfinite count is 0 when the norm is finite (a NaN or Inf element makes the sum of
  squares NaN/Inf), so ``isfinite`` runs only on tensors that have one;
* std comes from ``E[x²] - mean²`` when that is well conditioned (``mean²`` small against
  ``E[x²]``, as for gradients and most weights), else from an exact second pass
  ``‖x - mean‖²`` (e.g. a LayerNorm weight of ones).

Tensors longer than ``chunk_elems`` are read in slices, so a temporary (a float32 copy of a
half-precision slice, the centred slice) never exceeds one chunk. Partial results are
combined in float64 on the host.
"""

from __future__ import annotations

import math

import torch

# E[x²] / var above which the one-pass variance loses too many digits: float32 sums of
# squares carry ~1e-7 relative error, multiplied by this ratio in the variance. 16 keeps std
# within ~1e-5 relative; beyond it the exact second pass runs.
_ONE_PASS_MAX_RATIO = 16.0

# On the CPU a reduction costs ~2-5 us of dispatch whatever its size: tensors at most this
# big (elements; 16 KiB of float32) are stacked with others of their size and reduced
# together, here and in stats.NormPlan; larger ones keep their own reduction (stacking
# would copy megabytes that a reduction only has to read).
SMALL_NUMEL = 4096


def host_stats(tensors: list[torch.Tensor], chunk_elems: int) -> torch.Tensor:
    """``[len(tensors), 8]`` float32 rows (NORM..NONFINITE) for CPU tensors, with the same
    semantics as :meth:`stats.FullStats.__call__`."""
    flats = [t.detach().reshape(-1) for t in tensors]
    rows: list[list[float] | None] = [None] * len(flats)
    # Small tensors of one size (biases, norm weights: most of a model's tensors, few of its
    # values) are stacked and reduced along dim 1, a handful of calls per size instead of a
    # handful per tensor; large ones are read one by one, never copied.
    by_size: dict[tuple[int, torch.dtype], list[int]] = {}
    for i, f in enumerate(flats):
        if 0 < f.numel() <= SMALL_NUMEL:
            by_size.setdefault((f.numel(), f.dtype), []).append(i)
    for idx in by_size.values():
        if len(idx) > 1:
            for i, row in zip(idx, _stacked([flats[i] for i in idx]), strict=True):
                rows[i] = row
    for i, f in enumerate(flats):
        if rows[i] is None:
            rows[i] = _row(f, chunk_elems)
    return torch.tensor(rows, dtype=torch.float32).reshape(len(rows), 8)


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float32 else x.to(torch.float32)


def _stacked(flats: list[torch.Tensor]) -> list[list[float]]:
    """Rows of equal-length small tensors, reduced together as one [k, L] matrix."""
    x = _f32(torch.stack(flats))
    n = x.shape[1]
    norm = torch.linalg.vector_norm(x, dim=1).tolist()
    total = x.sum(dim=1).tolist()
    mn, mx = (v.tolist() for v in torch.aminmax(x, dim=1))
    nonzero = torch.count_nonzero(x, dim=1).tolist()
    rows = []
    for k in range(len(flats)):
        row = x[k]
        nonfinite = 0
        if not math.isfinite(norm[k]):
            nonfinite = n - int(torch.isfinite(row).sum())
        saw_nan = math.isnan(mn[k]) or math.isnan(mx[k])
        rows.append(_finish(n, norm[k] * norm[k], total[k], mn[k], mx[k], saw_nan,
                            nonzero[k], nonfinite, [row]))
    return rows


def _row(flat: torch.Tensor, chunk: int) -> list[float]:
    n = flat.numel()
    if n == 0:
        nan = math.nan
        return [0.0, nan, nan, nan, nan, nan, nan, 0.0]
    # One float32 tensor when it fits a chunk; else views of chunk-long slices, converted
    # one at a time where they are read, so no temporary exceeds a chunk.
    pieces = [_f32(flat)] if n <= chunk else [flat[s:s + chunk] for s in range(0, n, chunk)]
    sumsq = total = 0.0
    lo, hi = math.inf, -math.inf
    saw_nan = False
    nonzero = nonfinite = 0
    for piece in pieces:
        x = _f32(piece)
        norm = float(torch.linalg.vector_norm(x))
        sumsq += norm * norm
        total += float(x.sum())
        mn, mx = (float(v) for v in torch.aminmax(x))
        saw_nan = saw_nan or math.isnan(mn) or math.isnan(mx)
        lo, hi = min(lo, mn), max(hi, mx)
        nonzero += int(torch.count_nonzero(x))
        if not math.isfinite(norm):  # only then can an element be NaN or Inf
            nonfinite += x.numel() - int(torch.isfinite(x).sum())
    return _finish(n, sumsq, total, lo, hi, saw_nan, nonzero, nonfinite, pieces)


def _finish(n: int, sumsq: float, total: float, lo: float, hi: float, saw_nan: bool,
            nonzero: int, nonfinite: int, pieces: list[torch.Tensor]) -> list[float]:
    """One row from a tensor's partial sums; ``pieces`` (its values) for the second pass."""
    nan = math.nan
    if saw_nan:
        lo = hi = nan
    mean = total / n
    if nonfinite or not math.isfinite(sumsq):
        # NumPy semantics: any NaN/Inf makes std NaN. (sumsq alone can overflow float32 with
        # finite values: then std is NaN here too; such tensors are already broken.)
        std = nan
    else:
        ms = sumsq / n
        var = ms - mean * mean
        if var <= 0.0 or ms > _ONE_PASS_MAX_RATIO * var:
            m2 = 0.0
            for piece in pieces:
                d = float(torch.linalg.vector_norm(_f32(piece) - mean))
                m2 += d * d
            var = m2 / n
        std = math.sqrt(max(var, 0.0))
    absmax = nan if saw_nan else max(abs(lo), abs(hi))
    return [math.sqrt(sumsq), absmax, mean, std, lo, hi, (n - nonzero) / n, float(nonfinite)]
