"""Batched tensor statistics, computed on the tensors' device without a host sync.

Two paths:

* :class:`NormPlan` / :func:`norms` — the every-step path: one ``torch._foreach_norm`` over
  all tensors (one fused launch per device on CUDA; on CPU small tensors are stacked by size
  first, since there the foreach op is a loop with per-tensor dispatch cost), stacked into a
  single float32 vector.
* :class:`FullStats` — the cadence path: norm, absmax, mean, std, min, max, zero fraction and
  nonfinite count of many tensors at once. Tensors of the same size and dtype (layers repeat
  their shapes) are stacked into one ``[P, L]`` matrix per group, in groups of at most
  ``chunk_elems`` elements, and each statistic is one ordinary reduction over ``dim=1``
  (``vector_norm``, ``var_mean``, ``aminmax``, ...): a handful of kernels per group however
  many tensors it holds, and the accurate reductions torch already has. A tensor larger than
  a chunk is cut into pieces whose partial results are combined with Chan's parallel
  formula, so temporary memory stays bounded whatever the model's size.
  That is the accelerator path; CPU tensors take the per-tensor host path of
  :mod:`stats_host` (same results, ~10x faster there: see its docstring).

Neither path calls ``.item()``, ``.cpu()`` or anything else that waits for the device: the
results stay on the device until the recorder copies them out with one non-blocking copy.
Lengths/owner index tensors depend only on the tensors' shapes, so they are built once per
layout and cached on the device.
"""

from __future__ import annotations

import math

import torch

from .stats_host import SMALL_NUMEL, host_stats

# Column order of a FullStats result row (matches schema.STAT_COLUMNS).
NORM, ABSMAX, MEAN, STD, MIN, MAX, ZERO_FRAC, NONFINITE = range(8)
N_STATS = 8


_NARROW_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def uniform(tensors: list[torch.Tensor]) -> bool:
    """True when the tensors may take :class:`NormPlan`'s unchecked path: all on one device,
    all fp16/bf16/fp32. (A per-tensor loop: call it once per layout, not per step.)"""
    if not tensors:
        return False
    device = tensors[0].device
    return all(t.device == device and t.dtype in _NARROW_FLOATS for t in tensors)


class NormPlan:
    """Per-step L2 norms of one gradient layout, planned once and reused every step.

    Built from the first step's tensors (callers check :func:`uniform` first): on CUDA and
    other accelerators the plan is one ``_foreach_norm`` (a fused multi-tensor kernel). On
    CPU (where ``_foreach_norm`` is a loop with ~2 us of dispatch per tensor), small tensors
    (at most ``SMALL_NUMEL`` elements) of the same shape are stacked into one ``[P, *shape]``
    tensor and reduced with one ``vector_norm`` per shape, and large ones go through
    ``_foreach_norm``.
    The result is in the plan's order: ``order[k]`` is the input index of value ``k``
    (``None``: input order). Putting it back in input order would be one more indexing op
    on the training thread (~30 us on a 2-core machine, right after backward); the caller
    relabels the values instead, once per layout. Same values as :func:`norms`: float32
    accumulation, NaN/Inf propagate.
    """

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.n = len(tensors)
        self.large: list[int] = []
        self.small: list[tuple[list[int], tuple[int, ...]]] = []  # (indices, dims to reduce)
        self.order: tuple[int, ...] | None = None
        # float32 gradients need no accumulation dtype (passing one costs a conversion
        # check per tensor); fp16/bf16 accumulate in float32 so large norms cannot overflow.
        self.dtype = (None if all(t.dtype == torch.float32 for t in tensors)
                      else torch.float32)
        if tensors[0].device.type != "cpu":
            return
        by_shape: dict[tuple[tuple[int, ...], torch.dtype], list[int]] = {}
        for i, t in enumerate(tensors):
            if 0 < t.numel() <= SMALL_NUMEL:
                by_shape.setdefault((tuple(t.shape), t.dtype), []).append(i)
            else:
                self.large.append(i)
        for (shape, _), idx in by_shape.items():
            if len(idx) > 1:
                self.small.append((idx, tuple(range(1, len(shape) + 1))))
            else:
                self.large += idx
        if not self.small:  # nothing to stack: plain foreach, no reordering
            self.large = []
            return
        self.order = tuple(self.large + [i for idx, _ in self.small for i in idx])

    def __call__(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        if len(tensors) != self.n:
            raise RuntimeError("gradient layout changed")
        if self.order is None:
            return torch.stack(torch._foreach_norm(tensors, 2, dtype=self.dtype))
        parts = []
        if self.large:
            parts.append(torch.stack(torch._foreach_norm([tensors[i] for i in self.large], 2,
                                                         dtype=self.dtype)))
        for idx, dims in self.small:
            x = torch.stack([tensors[i] for i in idx])
            parts.append(torch.linalg.vector_norm(x, dim=dims, dtype=torch.float32))
        return torch.cat(parts) if len(parts) > 1 else parts[0]


def norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    """L2 norm of each tensor as one float32 vector on the first tensor's device.

    NaN/Inf propagate (that is how nonfinite gradients are detected for free). Accumulates in
    float32 even for fp16/bf16 tensors, so large norms do not overflow. This is the checked
    path for any mix of devices and dtypes; the every-step path is :class:`NormPlan`.
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

    def __init__(self, chunk_elems: int = 1 << 23, *, host: bool | None = None) -> None:
        """``host``: use the per-tensor host path (:mod:`stats_host`); ``None`` chooses it
        for CPU tensors and the grouped path for accelerators. Tests force each path."""
        if chunk_elems < 1:
            raise ValueError("chunk_elems must be >= 1")
        self.chunk_elems = chunk_elems
        self.host = host
        self._layouts: dict[tuple, tuple[list[_Group], torch.Tensor, torch.Tensor]] = {}

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
        host = self._host(device)
        # (the host path reads values at once: its copies must not be non-blocking)
        tensors = [t.to(device, non_blocking=not host) if t.device != device else t
                   for t in tensors]
        if host:
            return host_stats(tensors, self.chunk_elems)
        key = (device, tuple((t.numel(), t.dtype) for t in tensors))
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._plan(key[1], device)
            if len(self._layouts) > 64:  # models whose tensor set keeps changing
                self._layouts.clear()
            self._layouts[key] = layout
        groups, owner, numel = layout
        flat = [t.detach().reshape(-1) for t in tensors]
        piece_stats = torch.cat([g.reduce(flat) for g in groups]) if groups else None
        return _combine(piece_stats, owner, len(tensors), numel, device)

    def one(self, t: torch.Tensor) -> torch.Tensor:
        """``[1, 8]`` statistics of a single tensor (activations, watched tensors): the same
        semantics as ``__call__`` in a handful of reductions, without grouping or combining.
        Tensors larger than a chunk take the chunked path (bounded memory)."""
        if t.numel() == 0 or t.numel() > self.chunk_elems or self._host(t.device):
            return self([t])
        x = t.detach().reshape(-1).to(torch.float32)
        var, _ = torch.var_mean(x, correction=0)
        mn, mx = torch.aminmax(x)
        n = float(x.numel())
        return torch.stack([
            torch.linalg.vector_norm(x), torch.maximum(mn.abs(), mx.abs()), x.sum() / n,
            var.sqrt(), mn, mx, (x == 0).sum() / n,
            torch.isfinite(x).logical_not_().sum().to(torch.float32),
        ]).reshape(1, N_STATS)

    def _host(self, device: torch.device) -> bool:
        return device.type == "cpu" if self.host is None else self.host

    def _plan(self, keys: tuple[tuple[int, torch.dtype], ...], device: torch.device
              ) -> tuple[list[_Group], torch.Tensor, torch.Tensor]:
        """Group same-size, same-dtype tensors (pieces of a tensor larger than a chunk) into
        stacks of at most chunk_elems elements. Built once per layout: on CUDA the small
        host-to-device copies of the index tensors happen only then, never per call."""
        limit = self.chunk_elems
        by_shape: dict[tuple[int, torch.dtype], list[tuple[int, int, int]]] = {}
        for i, (n, dtype) in enumerate(keys):
            start = 0
            while n - start > limit:  # only a tensor bigger than a whole chunk gets here
                by_shape.setdefault((limit, dtype), []).append((i, start, start + limit))
                start += limit
            if n - start > 0 or n == 0:
                by_shape.setdefault((n - start, dtype), []).append((i, start, n))
        groups: list[_Group] = []
        for (length, _), pieces in by_shape.items():
            per = max(1, limit // max(length, 1))
            for k in range(0, len(pieces), per):
                groups.append(_Group(pieces[k:k + per], length))
        owner = torch.tensor([i for g in groups for i, _, _ in g.pieces], dtype=torch.int64)
        numel = torch.tensor([n for n, _ in keys], dtype=torch.float32)
        return (groups, owner.to(device, non_blocking=True),
                numel.to(device, non_blocking=True))


class _Group:
    """P pieces of equal length L, reduced together as one [P, L] matrix."""

    def __init__(self, pieces: list[tuple[int, int, int]], length: int) -> None:
        self.pieces = pieces
        self.length = length

    def reduce(self, flat: list[torch.Tensor]) -> torch.Tensor:
        """``[P, 8]`` float64 partials: count, sum, m2, sumsq, min, max, zeros, nonfinite."""
        rows = [flat[i][start:stop] for i, start, stop in self.pieces]
        p = len(rows)
        if self.length == 0:  # empty tensors: nothing to reduce
            z = torch.zeros(p, dtype=torch.float64, device=flat[self.pieces[0][0]].device)
            nan = torch.full_like(z, math.nan)
            return torch.stack([z, z, z, z, nan, nan, z, z], dim=1)
        # One copy into a float32 [P, L] matrix (the only temporary of this size).
        x = torch.stack(rows).to(torch.float32) if p > 1 else rows[0].to(torch.float32)[None]
        # var_mean is accurate (not E[x²] - E[x]²); its Welford mean turns [inf, 1] into NaN,
        # so the sum (and from it the mean) comes from a plain sum, as in NumPy.
        var, _ = torch.var_mean(x, dim=1, correction=0)
        total = x.sum(dim=1)
        norm = torch.linalg.vector_norm(x, dim=1)
        mn, mx = torch.aminmax(x, dim=1)
        zeros = (x == 0).sum(dim=1)
        nonfinite = torch.isfinite(x).logical_not_().sum(dim=1)
        count = torch.full_like(total, float(self.length))
        return torch.stack([count, total, var * count, norm * norm, mn, mx,
                            zeros.to(total.dtype), nonfinite.to(total.dtype)],
                           dim=1).to(torch.float64)


def _combine(piece_stats: torch.Tensor | None, owner: torch.Tensor, n: int,
             numel: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Merge per-piece partial statistics into per-tensor rows (Chan et al.)."""
    out = torch.full((n, N_STATS), math.nan, dtype=torch.float32, device=device)
    out[:, NONFINITE] = 0.0
    out[:, NORM] = 0.0
    if piece_stats is None:
        return out
    p_count, p_sum, p_m2, p_sumsq, p_min, p_max, p_zeros, p_nonfinite = piece_stats.unbind(1)

    def add(v: torch.Tensor) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.float64, device=device).index_add_(0, owner, v)

    count = add(p_count)
    mean = add(p_sum) / count.clamp(min=1.0)
    p_mean = p_sum / p_count.clamp(min=1.0)
    delta = p_mean - mean[owner]
    m2 = add(p_m2 + p_count * delta * delta)
    inf = math.inf
    f64 = torch.float64
    mn = torch.full((n,), inf, dtype=f64, device=device).scatter_reduce_(0, owner, p_min, "amin")
    mx = torch.full((n,), -inf, dtype=f64, device=device).scatter_reduce_(0, owner, p_max,
                                                                           "amax")
    has = count > 0
    # torch.full fills on the device; torch.tensor(nan, device=cuda) would be a synchronous
    # host-to-device copy.
    nan = torch.full((), math.nan, dtype=f64, device=device)
    out[:, NORM] = add(p_sumsq).sqrt()
    out[:, MEAN] = torch.where(has, mean, nan)
    out[:, STD] = torch.where(has, (m2 / count.clamp(min=1.0)).clamp(min=0.0).sqrt(), nan)
    out[:, MIN] = torch.where(has, mn, nan)
    out[:, MAX] = torch.where(has, mx, nan)
    out[:, ABSMAX] = torch.where(has, torch.maximum(mn.abs(), mx.abs()), nan)
    out[:, ZERO_FRAC] = torch.where(numel > 0, add(p_zeros) / numel.clamp(min=1.0),
                                    nan).to(torch.float32)
    out[:, NONFINITE] = add(p_nonfinite)
    return out
