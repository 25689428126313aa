"""Per-tensor histograms over the fixed log-spaced bins of ``format/histbins.py``, computed
on the tensors' device, many tensors at once, without a host sync.

The tensors are laid end to end in chunks of at most ``chunk_elems`` elements (a tensor
larger than a chunk is cut into slices), each chunk copied once into a float32 buffer. On
that buffer a handful of elementwise kernels give every element its bin (``sign(x) *
(clamp(floor((log10|x| - LO) * PER), -1, K) + 2)``), a ``repeat_interleave`` of each
tensor's slot (its index times the number of bins) is added, and one ``histc`` over
``slots * NBINS`` unit-wide bins counts every tensor's histogram in one kernel. So a chunk
costs ~10 kernels however many tensors it holds, and the temporary memory is ~4 float32
copies of one chunk. The layout of the chunks depends only on the tensors' sizes: planned
once per layout and cached, with its index tensors on the device.

``histc`` counts in float32, exact to 2**24 per chunk (a chunk is at most that); the chunks'
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


class _Plan:
    """Where each tensor's elements go: chunks of (tensor index, start, stop) slices, and
    per chunk the slot offsets to repeat over its slices."""

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
        self.offsets = [_on(device, [float(i * NBINS) for i, _, _ in c], torch.float32)
                        for c in self.chunks]
        self.lengths = [_on(device, [b - a for _, a, b in c], torch.int64)
                        for c in self.chunks]
        self.sizes = [sum(b - a for _, a, b in c) for c in self.chunks]


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
        total = torch.zeros(len(tensors) * NBINS, dtype=torch.int64, device=device)
        flat = [t.detach().reshape(-1) for t in tensors]
        for chunk, offs, lens, size in zip(plan.chunks, plan.offsets, plan.lengths,
                                           plan.sizes, strict=True):
            # a float32 copy of the chunk's elements (never the user's tensors: x changes)
            x = (torch.cat([flat[i][a:b] for i, a, b in chunk]).to(torch.float32)
                 if len(chunk) > 1 else
                 flat[chunk[0][0]][chunk[0][1]:chunk[0][2]].to(torch.float32, copy=True))
            u = x.abs().log10_().sub_(LO_EXP).mul_(PER_DECADE).floor_()
            u.clamp_(-1, K).add_(2).mul_(x.sign_())  # (x is ours: a copy)
            # slot offsets, without a sync: the output size is known on the host
            u += torch.repeat_interleave(offs, lens, output_size=size)
            u += K + 2
            h = torch.histc(u, bins=len(tensors) * NBINS, min=-0.5,
                            max=len(tensors) * NBINS - 0.5)
            total += h.to(torch.int64)
        return total.view(len(tensors), NBINS)

    def piece(self, label: str, names: tuple[str, ...], tensors: list[torch.Tensor]
              ) -> tuple[Piece, torch.Tensor]:
        """The step piece of these tensors' histograms (``label``: hist_grad, hist_param):
        per tensor, NBINS high halves then NBINS low halves of the counts."""
        c = self.counts(tensors)
        halves = torch.cat([torch.div(c, SPLIT, rounding_mode="floor"), c % SPLIT], dim=1)
        return (Piece(label, len(tensors) * 2 * NBINS, names,
                      tuple(t.numel() for t in tensors)), halves.reshape(-1))

