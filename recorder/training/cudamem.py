"""The CUDA caching allocator's counters at the end of each recorded step.

Read on the training thread when a step is committed, so every ``memory`` row holds its own
step's state. (They used to be read on the writer thread when it woke, so a batch of rows all
carried the moment of the flush: a run leaking 3 GiB a step into an OOM showed 138 GiB and
one OOM from step 0.) The counters are the allocator's host-side bookkeeping: reading them
never waits for the GPU, and because the allocator accounts a block when the host asks for
it, not when a kernel runs, "the end of the step" on the host is exactly the step's state.

The cheap path: ``torch._C._cuda_memoryStats(index)``, the C++ call under
``torch.cuda.memory_stats_as_nested_dict``, read directly. ``memory_stats()`` flattens its
~150 keys in Python (0.3 ms a step, measured on an H200); ``memory_allocated()`` and
friends each call it again. One nested-dict call plus six lookups builds a few hundred small
Python objects in C++ (a few µs to ~20 µs). Its measured median over the first reads is
reported once as a ``recorder_cost`` info event, so every GPU run says what it cost.

``cuda_peak_bytes`` is the peak *since the previous row*, without resetting the allocator's
peak (``reset_peak_memory_stats`` would change what the user's own
``torch.cuda.max_memory_allocated()`` returns, and what HF Trainer's memory metrics report).
The allocator keeps one high-water mark; the window's peak is known exactly when that mark
rose during the window (the new mark was reached in it) or when the current value equals
it; otherwise it is null (the window's peak lies somewhere at or below the mark).
``cuda_max_allocated_bytes`` is the mark itself (since the process started or the user last
reset it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

COST_SAMPLES = 64
"""Reads timed before the median is reported (the first few include cold caches)."""


def _nested(stats: dict[str, Any], *keys: str) -> Any:
    node: Any = stats
    for k in keys:
        node = node.get(k) if isinstance(node, dict) else None
    return node


class CudaCounters:
    """The allocator's counters of one CUDA device, read at each recorded step's end."""

    def __init__(self, device: torch.device,
                 on_cost: Callable[[str, dict[str, Any]], None] | None = None,
                 stats: Callable[[int], dict[str, Any]] | None = None) -> None:
        """``on_cost(message, details)`` is called once, after :data:`COST_SAMPLES` reads,
        with their median cost. ``stats(index)`` replaces the allocator call (tests)."""
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self._stats = stats or getattr(torch._C, "_cuda_memoryStats", None) or (
            lambda i: torch.cuda.memory_stats_as_nested_dict(i))
        self._mark: int | None = None  # the allocator's high-water mark at the previous row
        self._costs: list[float] | None = [] if on_cost is not None else None
        self._on_cost = on_cost

    def read(self) -> dict[str, Any]:
        """This moment's counters as ``memory`` row columns, ``cuda_peak_bytes`` since the
        previous :meth:`read`. Never syncs with the GPU."""
        t0 = time.perf_counter()
        row = self.now()
        current, mark = row["cuda_allocated_bytes"], row["cuda_max_allocated_bytes"]
        window = None
        if mark is not None:
            # Exact only when the mark rose in this window (the first row: since start) or
            # the current value sits at it; a fall of the mark means the user reset it.
            if self._mark is None or mark > self._mark or (current is not None
                                                           and current >= mark):
                window = mark
            self._mark = mark
        row["cuda_peak_bytes"] = window
        costs = self._costs
        if costs is not None:
            costs.append(time.perf_counter() - t0)
            if len(costs) == COST_SAMPLES:
                self._costs = None
                if self._on_cost is not None:
                    us = sorted(costs)[COST_SAMPLES // 2] * 1e6
                    self._on_cost(f"reading the CUDA allocator's counters at a step's end "
                                  f"costs {us:.1f} µs (median of {COST_SAMPLES})",
                                  {"cuda_memory_read_us": us})
        return row

    def now(self) -> dict[str, Any]:
        """The counters at this moment (``cuda_peak_bytes``: the high-water mark), leaving
        the rows' windows as they are (an exception's event reads this)."""
        stats = self._stats(self.index)  # host-side bookkeeping under the allocator's mutex
        alloc = _nested(stats, "allocated_bytes", "all") or {}
        return {
            "cuda_allocated_bytes": alloc.get("current"),
            "cuda_reserved_bytes": _nested(stats, "reserved_bytes", "all", "current"),
            "cuda_peak_bytes": alloc.get("peak"),
            "cuda_max_allocated_bytes": alloc.get("peak"),
            "cuda_alloc_retries": stats.get("num_alloc_retries"),
            "cuda_ooms": stats.get("num_ooms"),
        }
