"""glibc's malloc thresholds, fixed for a CPU training process the recorder watches.

glibc returns the top of its heap to the system when more than ``M_TRIM_THRESHOLD`` of it is
free, and serves allocations above ``M_MMAP_THRESHOLD`` with fresh ``mmap``s; both start
small (128 KiB) and rise as large blocks are freed. A CPU training step allocates and frees
the same megabytes every step, and whether those land below the trim threshold depends on
where every other allocation sits. The recorder's full-statistics steps add a few small
allocations on the training thread, and that was enough to tip the heap of a
``transformers.Trainer`` run into trimming and faulting the same ~6 MiB back in on every
step from then on: 1,593 page faults a step against 0 without the recorder, +2.4 ms on a
15 ms step (the statistics themselves cost 0.1 ms; stubbing them out removed the faults).

Fixing the thresholds where a training process ends up anyway (heap blocks up to 32 MiB,
64 MiB of free top kept) makes the heap stable whatever the recorder allocates: the
Trainer callback's overhead went from +14% to +6.6% against the plain loop's +5.8%
(benchmarks/callback_overhead_ab.py, interleaved). Only for CPU training (on a GPU the
statistics stay on the device), only on glibc, and ``tune_malloc=False`` leaves malloc
alone. The thresholds are process-wide: the change is recorded as an ``info`` event.
"""

from __future__ import annotations

import ctypes
from typing import Any

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
"""glibc's own ceiling for its dynamic mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX, 64-bit)."""
TRIM_THRESHOLD = 64 << 20
"""Twice the mmap threshold, as glibc sets it when it raises the threshold itself."""


def fix_thresholds() -> dict[str, Any] | None:
    """Set the thresholds (glibc only); what was set, or None when this is not glibc."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (glibc: musl and macOS have no such symbol)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and
            mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return None
    return {"mmap_threshold": MMAP_THRESHOLD, "trim_threshold": TRIM_THRESHOLD}


def tune_for(device: Any, enabled: bool, event: Any) -> None:
    """Fix the thresholds for training on ``device`` when it is the CPU (or unknown) and
    ``enabled``; say so with an ``info`` event (``event``: the Recorder's)."""
    if not enabled or (device is not None and getattr(device, "type", "cpu") != "cpu"):
        return
    done = fix_thresholds()
    if done is not None:
        event("malloc_tuned", "glibc malloc thresholds fixed for CPU training (mmap 32 MiB, "
              "trim 64 MiB): a stable heap whatever the recorder allocates (tune_malloc=False "
              "leaves malloc alone)", severity="info", **done)
