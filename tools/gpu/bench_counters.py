"""Cost of reading the CUDA caching allocator's counters, the ways torch offers (median of
2,000 calls after 50 warm ones, with p10 and p90). Run on a CUDA machine:

    python tools/gpu/bench_counters.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def timed(fn: Callable[[], object], n: int = 2000) -> tuple[float, float, float]:
    """Median, p10 and p90 of ``fn``'s wall time in µs."""
    for _ in range(50):
        fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[n // 2] * 1e6, ts[n // 10] * 1e6, ts[9 * n // 10] * 1e6


def main() -> None:
    torch.zeros(1, device="cuda")
    kept = [torch.empty(1 << 20, device="cuda") for _ in range(50)]  # a populated allocator
    calls: dict[str, Callable[[], object]] = {
        "_cuda_memoryStats (the recorder's)": lambda: torch._C._cuda_memoryStats(0),
        "memory_allocated": lambda: torch.cuda.memory_allocated(0),
        "_accelerator_getDeviceStats": lambda: torch._C._accelerator_getDeviceStats(0),
        "mem_get_info": lambda: torch.cuda.mem_get_info(0),
    }
    for name, fn in calls.items():
        try:
            med, p10, p90 = timed(fn)
            print(f"{name:36s} median {med:7.1f} µs (p10 {p10:.1f}, p90 {p90:.1f})")
        except Exception as exc:  # an API this torch lacks
            print(f"{name:36s} failed: {exc}")
    del kept


if __name__ == "__main__":
    main()
