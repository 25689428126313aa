"""Per-tensor histograms over the fixed log-spaced bins of ``format/histbins.py``, computed
on the tensors' device, many tensors at once, without a host sync.

The tensors are laid end to end in chunks of at most ``chunk_elems`` elements (a tensor
larger than a chunk is cut into slices), each chunk copied once into a float32 buffer. On
that buffer a handful of elementwise kernels give every element its bin (``sign(x) *
(clamp(floor((log10|x| - LO) * PER), -1, K) + 2)``): ~8 kernels per chunk however many
tensors it holds. Each tensor's slice of it is then counted by one ``histc`` over the
``NBINS`` unit-wide bins, and the counts stacked and added into the tensors' rows with one
``index_add_``. (One ``histc`` over every tensor's bins, shifted by a
``repeat_interleave`` of slot offsets, launches fewer kernels but measured 1.9x slower on a
CPU, 62.8 against 33.5 ms for the 4.2M-parameter benchmark GPT: the per-element offsets
cost more than the launches they save, which at a cadence of 100 steps are nothing on a
GPU either. NumPy's ``bincount`` of the bins as integers, on a CPU, measured slower
still: 103.7 against 71.7 ms, its int64 conversion costing more than ``histc``.) The chunk
layout depends only on the tensors' sizes: planned once per layout
and cached, with its index tensor on the device. Temporary memory: ~3 float32 copies of a
chunk.

``histc`` counts in float32, exact to 2**24 (a slice is at most a chunk, below that); the
counts are summed in int64. The step's one device-to-host copy is float32, so each count
goes out as two exact float32 halves: ``count // 2**20`` and ``count % 2**20``.
"""

from __future__ import annotations

import torch
from tracealyze.format.histbins import LO_EXP, NBINS, PER_DECADE, K

from ..capture import Piece

SPLIT = 1 << 20
"""Counts leave the device as (count // SPLIT, count % SPLIT): both exact in float32."""
MAX_CHUNK = 1 << 22
"""Elements per chunk at most (~64 MiB of float32 temporaries), below 2**24 so that
``histc``'s float32 counts are exact."""


def _on(device: torch.device, values: list, dtype: torch.dtype) -> torch.Tensor:
    """A small index tensor on ``device`` without a sync: staged in pinned memory and
    copied non-blocking (a copy from pageable memory waits for the device)."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def count(u: torch.Tensor, strict: bool = False) -> torch.Tensor:
    """Counts of bin values ``u`` (floats -(K+2)..K+2, NaN for no bin) over the NBINS bins,
    float32 (exact: at most a chunk of elements). ``strict``: through ``index_add_``
    instead of ``histc`` (deterministic on CUDA; slower)."""
    if not strict:
        return torch.histc(u, bins=NBINS, min=-(K + 2) - 0.5, max=K + 2 + 0.5)
    idx = torch.nan_to_num(u, nan=K + 3).add_(K + 2).to(torch.int64)  # NaN: bin NBINS
    ones = torch.ones_like(idx)
    out = torch.zeros(NBINS + 1, dtype=torch.int64, device=u.device).index_add_(0, idx, ones)
    return out[:NBINS].to(torch.float32)


class _Plan:
    """Where each tensor's elements go: chunks of (tensor index, start, stop) slices, and
    per chunk the tensor index of each slice (on the device, for ``index_add_``)."""

    def __init__(self, numels: tuple[int, ...], device: torch.device, chunk: int) -> None:
        self.chunks: list[list[tuple[int, int, int]]] = []
        cur: list[tuple[int, int, int]] = []
        room = chunk
        for i, n in enumerate(numels):
            start = 0
            while start < n:
                take = min(n - start, room)
                cur.append((i, start, start + take))
                start += take
                room -= take
                if room == 0:
                    self.chunks.append(cur)
                    cur, room = [], chunk
        if cur:
            self.chunks.append(cur)
        self.slots = [_on(device, [i for i, _, _ in c], torch.int64) for c in self.chunks]


class Histograms:
    """Histograms of lists of tensors (one device), plans cached per layout."""

    def __init__(self, chunk_elems: int = MAX_CHUNK) -> None:
        self.chunk = max(1, min(chunk_elems, MAX_CHUNK))
        self._plans: dict[tuple[tuple[int, ...], torch.device], _Plan] = {}

    def counts(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """``[len(tensors), NBINS]`` int64 counts on the tensors' device (no sync)."""
        device = tensors[0].device
        key = (tuple(t.numel() for t in tensors), device)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 16:  # (layouts seldom change: bound the cache anyway)
                self._plans.clear()
            plan = self._plans[key] = _Plan(key[0], device, self.chunk)
        total = torch.zeros(len(tensors), NBINS, dtype=torch.int64, device=device)
        # histc has no deterministic CUDA kernel: under use_deterministic_algorithms it
        # raises there, so the counts go through index_add_, which has one
        strict = device.type == "cuda" and torch.are_deterministic_algorithms_enabled()
        flat = [t.detach().reshape(-1) for t in tensors]
        for chunk, slots in zip(plan.chunks, plan.slots, strict=True):
            # a float32 copy of the chunk's elements (never the user's tensors: x changes)
            x = (torch.cat([flat[i][a:b] for i, a, b in chunk]).to(torch.float32)
                 if len(chunk) > 1 else
                 flat[chunk[0][0]][chunk[0][1]:chunk[0][2]].to(torch.float32, copy=True))
            # (below 10**LO every value is in an underflow bin: clamped first, so log10
            # never sees a zero or a denormal, which cost it ~20x on a CPU)
            u = x.abs().clamp_min_(10.0 ** (LO_EXP - 1)).log10_().sub_(LO_EXP)
            u.mul_(PER_DECADE).floor_()
            u.clamp_(-1, K).add_(2).mul_(x.sign_())  # bins -(K+2)..K+2; NaN stays NaN
            hs, pos = [], 0
            for _, a, b in chunk:
                hs.append(count(u[pos:pos + b - a], strict))
                pos += b - a
            total.index_add_(0, slots, torch.stack(hs).to(torch.int64))
        return total

    def piece(self, label: str, names: tuple[str, ...], tensors: list[torch.Tensor]
              ) -> tuple[Piece, torch.Tensor]:
        """The step piece of these tensors' histograms (``label``: hist_grad, hist_param):
        per tensor, NBINS high halves then NBINS low halves of the counts."""
        c = self.counts(tensors)
        halves = torch.cat([torch.div(c, SPLIT, rounding_mode="floor"), c % SPLIT], dim=1)
        return (Piece(label, len(tensors) * 2 * NBINS, names,
                      tuple(t.numel() for t in tensors)), halves.reshape(-1))

