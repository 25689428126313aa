"""The GPU vocabulary of ``trace_events.cat``, written once: as Python values for code that
builds or reads events, and as SQL for the queries over the table.

Kineto names device work ``kernel``, ``gpu_memcpy`` and ``gpu_memset`` (DESIGN.md "GPU time
breakdown"); the device timeline also holds ``cuda_sync`` and ``gpu_user_annotation``; the
host API calls that launch device work are ``cuda_runtime`` and ``cuda_driver``. Older traces
and ROCm builds spell some of them differently (``ALIASES``); ingest stores every event under
the names here, so one set of queries fits every trace.
"""

from __future__ import annotations

from collections.abc import Iterable

KERNEL = "kernel"
MEMCPY = "gpu_memcpy"
MEMSET = "gpu_memset"
SYNC = "cuda_sync"
GPU_ANNOTATION = "gpu_user_annotation"
RUNTIME = "cuda_runtime"
DRIVER = "cuda_driver"

GPU_ACTIVITY: tuple[str, ...] = (KERNEL, MEMCPY, MEMSET)
"""Work on the device: what GPU time is made of."""
GPU_SIDE: tuple[str, ...] = (*GPU_ACTIVITY, GPU_ANNOTATION, SYNC)
"""Everything drawn on the device timeline (its step comes from the launching event)."""
LAUNCH: tuple[str, ...] = (RUNTIME, DRIVER)
"""Host-side API calls that carry the correlation id of the device work they launch."""

ALIASES: dict[str, str] = {
    "Kernel": KERNEL,
    "Memcpy": MEMCPY,
    "Memset": MEMSET,
    "Runtime": RUNTIME,
    "Driver": DRIVER,
    "Operator": "cpu_op",
    "hip_runtime": RUNTIME,
    "hip_driver": DRIVER,
    "gpu_kernel": KERNEL,
    "Sync": SYNC,
}
"""Old (PyTorch 1.8–1.10) Kineto and some ROCm spellings of the same categories."""

OVERVIEW: tuple[str, ...] = (KERNEL, "memcpy", "memset", "communication", "runtime",
                             "dataloader", "cpu_exec")
"""The step overview's categories (the TensorBoard profiler plugin's), in priority order."""


def sql(cat: str) -> str:
    """One category as an SQL string literal (the names here hold no quote)."""
    return f"'{cat}'"


def sql_in(cats: Iterable[str]) -> str:
    """Categories as an SQL list for ``cat IN ...``."""
    return "(" + ", ".join(sql(c) for c in cats) + ")"


KERNEL_SQL = sql(KERNEL)
MEMCPY_SQL = sql(MEMCPY)
MEMSET_SQL = sql(MEMSET)
SYNC_SQL = sql(SYNC)
GPU_ACTIVITY_SQL = sql_in(GPU_ACTIVITY)
GPU_SIDE_SQL = sql_in(GPU_SIDE)
LAUNCH_SQL = sql_in(LAUNCH)
GPU_OR_LAUNCH_SQL = sql_in((*GPU_ACTIVITY, *LAUNCH))
