"""Batched tensor statistics, computed on the tensors' device without a host sync.

Two paths:

* :func:`norms` — the every-step path: one ``torch._foreach_norm`` over all tensors (one
  fused launch per device on CUDA), stacked into a single float32 vector.
* :class:`FullStats` — the cadence path: norm, absmax, mean, std, min, max, zero fraction and
  nonfinite count of many tensors at once. Tensors are cut into pieces of at most
  ``chunk_elems`` elements, each chunk of pieces is concatenated once into a float32 buffer
  and reduced per piece with ``segment_reduce``; pieces of one tensor are then combined with
  Chan's parallel formula. Temporary memory is bounded by the chunk size, whatever the
  model's size, and the number of kernel launches does not grow with the number of tensors.

Neither path calls ``.item()``, ``.cpu()`` or anything else that waits for the device: the
results stay on the device until the recorder copies them out with one non-blocking copy.
Lengths/owner index tensors depend only on the tensors' shapes, so they are built once per
layout and cached on the device.
"""

from __future__ import annotations

import math

import torch

# Column order of a FullStats result row (matches schema.STAT_COLUMNS).
NORM, ABSMAX, MEAN, STD, MIN, MAX, ZERO_FRAC, NONFINITE = range(8)
N_STATS = 8


def norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    """L2 norm of each tensor as one float32 vector on the first tensor's device.

    NaN/Inf propagate (that is how nonfinite gradients are detected for free). Accumulates in
    float32 even for fp16/bf16 tensors, so large norms do not overflow.
    """
    if not tensors:
        return torch.empty(0, dtype=torch.float32)
    # _foreach_norm accepts only floating/complex tensors; integer and bool ones (watched
    # tensors, never gradients) are cast first, so the cast costs nothing on the hot path.
    tensors = [t if t.is_floating_point() or t.is_complex() else t.to(torch.float32)
               for t in tensors]
    device = tensors[0].device
    if all(t.device == device for t in tensors):
        return _norms32(tensors)
    # Rare (model split over devices): one foreach call per device, results gathered on the
    # first device with non-blocking copies, then put back in input order.
    by_dev: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_dev.setdefault(t.device, []).append(i)
    out = torch.empty(len(tensors), dtype=torch.float32, device=device)
    for _dev, idx in by_dev.items():
        # Indexing with a Python list copies the index to the device; acceptable on this
        # rare multi-device path.
        part = _norms32([tensors[i] for i in idx])
        out[idx] = part.to(device, non_blocking=True)
    return out


def _norms32(tensors: list[torch.Tensor]) -> torch.Tensor:
    """float32 norms of tensors on one device."""
    if not any(t.dtype in (torch.float64, torch.complex128) for t in tensors):
        return torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32))
    # vector_norm refuses dtype=float32 for double tensors (it never narrows): norm those in
    # their own precision and cast the result; the rest keep the float32 accumulation.
    wide = [t.dtype in (torch.float64, torch.complex128) for t in tensors]
    narrow = [t for t, w in zip(tensors, wide, strict=True) if not w]
    narrow_norms = iter(torch._foreach_norm(narrow, 2, dtype=torch.float32) if narrow else [])
    wide_norms = iter(torch._foreach_norm([t for t, w in zip(tensors, wide, strict=True) if w], 2))
    return torch.stack([next(wide_norms).float() if w else next(narrow_norms) for w in wide])


class FullStats:
    """Full statistics of a list of tensors; reuses device index tensors across calls."""

    def __init__(self, chunk_elems: int = 1 << 23) -> None:
        if chunk_elems < 1:
            raise ValueError("chunk_elems must be >= 1")
        self.chunk_elems = chunk_elems
        self._layouts: dict[tuple, tuple[list[_Chunk], torch.Tensor]] = {}

    def __call__(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """``[len(tensors), 8]`` float32 on the first tensor's device, columns NORM..NONFINITE.

        Every statistic covers all elements with IEEE semantics, exactly like plain NumPy
        (``np.linalg.norm, np.abs(a).max(), a.mean(), a.std(), a.min(), a.max()``): a NaN
        propagates, an Inf makes max/absmax Inf and std NaN. std has ddof=0. An empty tensor
        has norm 0 and NaN (null) for the rest; nonfinite counts NaN and ±Inf elements.
        """
        if not tensors:
            return torch.empty(0, N_STATS, dtype=torch.float32)
        device = tensors[0].device
        tensors = [t.to(device, non_blocking=True) if t.device != device else t
                   for t in tensors]
        key = (device, tuple(t.numel() for t in tensors))
        layout = self._layouts.get(key)
        if layout is None:
            # Built once per layout. On CUDA the small host-to-device copy of `numel` (and
            # of each chunk's index tensors) happens only then, never per call.
            numel = torch.tensor(key[1], dtype=torch.float32).to(device, non_blocking=True)
            layout = (self._plan(key[1], device), numel)
            if len(self._layouts) > 64:  # models whose tensor set keeps changing
                self._layouts.clear()
            self._layouts[key] = layout
        chunks, numel = layout
        flat = [t.detach().reshape(-1) for t in tensors]
        piece_stats = torch.cat([c.reduce(flat) for c in chunks]) if chunks else None
        return _combine(piece_stats, chunks, len(tensors), numel, device)

    def _plan(self, numels: tuple[int, ...], device: torch.device) -> list[_Chunk]:
        """Group tensors into chunks of at most chunk_elems elements; a tensor larger than a
        chunk is cut into pieces, so temporary memory stays bounded."""
        limit = self.chunk_elems
        chunks: list[_Chunk] = []
        cur: list[tuple[int, int, int]] = []  # (tensor index, start, stop)
        cur_n = 0
        for i, n in enumerate(numels):
            if cur_n + n > limit and cur:
                chunks.append(_Chunk(cur, device))
                cur, cur_n = [], 0
            start = 0
            while n - start > limit:  # only a tensor bigger than a whole chunk gets here
                chunks.append(_Chunk([(i, start, start + limit)], device))
                start += limit
            cur.append((i, start, n))
            cur_n += n - start
        if cur:
            chunks.append(_Chunk(cur, device))
        return chunks


class _Chunk:
    """Pieces reduced together: one concatenation, a handful of segment reductions."""

    def __init__(self, pieces: list[tuple[int, int, int]], device: torch.device) -> None:
        self.pieces = pieces
        self.total = sum(stop - start for _, start, stop in pieces)
        # Built once per layout. On CUDA this host-to-device copy happens only the first time
        # a layout is seen (non_blocking from a fresh CPU tensor), never per step.
        self.lengths = torch.tensor([stop - start for _, start, stop in pieces],
                                    dtype=torch.int64).to(device, non_blocking=True)
        self.owner = torch.tensor([i for i, _, _ in pieces],
                                  dtype=torch.int64).to(device, non_blocking=True)

    def reduce(self, flat: list[torch.Tensor]) -> torch.Tensor:
        """``[n_pieces, 8]`` partials: count, sum, m2, sumsq, min, max, zeros, nonfinite."""
        parts = [flat[i][start:stop] for i, start, stop in self.pieces]
        if len({p.dtype for p in parts}) > 1:
            # torch.cat would promote mixed dtypes to e.g. bfloat16 (int32 + bf16) and round
            # the values before the float32 cast: convert each piece first instead.
            parts = [p.to(torch.float32) for p in parts]
        x = torch.cat(parts).to(torch.float32) if len(parts) > 1 else parts[0].to(torch.float32)
        lengths = self.lengths

        def seg(v: torch.Tensor, how: str) -> torch.Tensor:
            # unsafe=True skips a validation that sums `lengths` with .item() — a host-device
            # sync on CUDA. The lengths are ours and correct by construction.
            return torch.segment_reduce(v, how, lengths=lengths, unsafe=True)

        count = lengths.to(torch.float32)
        total = seg(x, "sum")
        mean = total / count.clamp(min=1.0)
        # Two-pass variance: subtract each piece's mean before squaring (the one-pass
        # E[x^2] - E[x]^2 formula loses everything to cancellation when |mean| >> std).
        # output_size avoids the sync repeat_interleave would need to size its result.
        centred = x - torch.repeat_interleave(mean, lengths, output_size=self.total)
        m2 = seg(centred.square_(), "sum")
        sumsq = seg(x * x, "sum")
        mn = seg(x, "min")
        mx = seg(x, "max")
        zeros = seg((x == 0).to(torch.float32), "sum")
        nonfinite = seg(torch.isfinite(x).logical_not_().to(torch.float32), "sum")
        return torch.stack([count, total, m2, sumsq, mn, mx, zeros, nonfinite], dim=1)


def _combine(piece_stats: torch.Tensor | None, chunks: list[_Chunk], n: int,
             numel: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Merge per-piece partial statistics into per-tensor rows (Chan et al.)."""
    out = torch.full((n, N_STATS), math.nan, dtype=torch.float32, device=device)
    out[:, NONFINITE] = 0.0
    out[:, NORM] = 0.0
    if piece_stats is None:
        return out
    owner = torch.cat([c.owner for c in chunks])
    p_count, p_sum, p_m2, p_sumsq, p_min, p_max, p_zeros, p_nonfinite = piece_stats.unbind(1)

    def add(v: torch.Tensor) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.float32, device=device).index_add_(0, owner, v)

    count = add(p_count)
    mean = add(p_sum) / count.clamp(min=1.0)
    p_mean = p_sum / p_count.clamp(min=1.0)
    delta = p_mean - mean[owner]
    m2 = add(p_m2 + p_count * delta * delta)
    inf = math.inf
    mn = torch.full((n,), inf, device=device).scatter_reduce_(0, owner, p_min, "amin")
    mx = torch.full((n,), -inf, device=device).scatter_reduce_(0, owner, p_max, "amax")
    has = count > 0
    # torch.full fills on the device; torch.tensor(nan, device=cuda) would be a synchronous
    # host-to-device copy.
    nan = torch.full((), math.nan, device=device)
    out[:, NORM] = add(p_sumsq).sqrt()
    out[:, MEAN] = torch.where(has, mean, nan)
    out[:, STD] = torch.where(has, (m2 / count.clamp(min=1.0)).clamp(min=0.0).sqrt(), nan)
    out[:, MIN] = torch.where(has, mn, nan)
    out[:, MAX] = torch.where(has, mx, nan)
    out[:, ABSMAX] = torch.where(has, torch.maximum(mn.abs(), mx.abs()), nan)
    out[:, ZERO_FRAC] = torch.where(numel > 0, add(p_zeros) / numel.clamp(min=1.0), nan)
    out[:, NONFINITE] = add(p_nonfinite)
    return out
