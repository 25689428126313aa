"""Memory snapshots and the ~1 s system sampler. Both run off the training thread."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil
import torch

from .cudamem import CudaCounters


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo2() -> Any:
    """glibc's ``mallinfo2`` (2.33+), or None (macOS, musl, older glibc)."""
    try:
        libc = ctypes.CDLL(None)
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    fn.argtypes = []
    return fn


class MemoryProbe:
    """Reads process RSS and the CUDA caching allocator's counters (no device sync).

    :meth:`rss` is cheap (one ``pread`` of /proc/self/statm on Linux) and runs on the training
    thread when a step is committed, so the value belongs to that step; so does :meth:`heap`
    (glibc's ``mallinfo2``, ~4 µs): the bytes malloc has handed out and not got back. Unlike
    RSS it does not lag a leak while the allocator reuses freed memory, and does not move
    when the allocator keeps or returns pages, so a leak of tensors shows from its first
    step (Python objects live in pymalloc arenas outside it: RSS still sees those). The CUDA
    allocator's counters are read at commit too (:meth:`cuda_at_commit`, cudamem.py);
    :meth:`snapshot` assembles the row on the writer thread.
    """

    def __init__(self, device: torch.device | None,
                 on_cost: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.proc = psutil.Process()
        self._statm: int | None = None
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        try:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:  # not Linux: psutil
            self._statm = None
        self.cuda = device is not None and device.type == "cuda" and torch.cuda.is_available()
        self.device = device
        self.total = None
        self.counters: CudaCounters | None = None
        if self.cuda:
            try:
                self.total = torch.cuda.get_device_properties(device).total_memory
            except Exception:
                self.total = None
            self.counters = CudaCounters(device, on_cost)

    on_counters: Callable[[dict[str, Any]], None] | None = None
    """Called with each row's CUDA counters on the training thread (oom.py arms history)."""

    def cuda_at_commit(self) -> dict[str, Any] | None:
        """The CUDA allocator's counters now, on the training thread (None without CUDA)."""
        if self.counters is None:
            return None
        row = self.counters.read()
        if self.on_counters is not None:
            self.on_counters(row)
        return row

    _mallinfo = _mallinfo2()
    # mallinfo2 walks every arena's free lists under their locks: ~4 µs in a small process,
    # but 160 µs a step was measured in a CUDA training process (many threads, many
    # arenas). There, past this median cost, the training thread stops reading it and the
    # writer thread reads it instead, a few ms later: the host heap of a GPU run barely
    # moves within a step. (A CPU run keeps reading it at the step boundary: its heap
    # holds the step's activations mid-step, and its steps are long.)
    SLOW_HEAP_S = 5e-5
    _HEAP_SAMPLES = 16

    _heap_costs: list[float] | None = None  # the first reads' costs, while undecided
    heap_on_writer = False

    def heap_at_commit(self) -> int | None:
        """:meth:`heap` on the training thread while it is cheap; None (the writer reads
        it) once the median of its first reads on a CUDA run took over ``SLOW_HEAP_S``."""
        if self.heap_on_writer:
            return None
        if not self.cuda or (self._heap_costs is not None
                             and len(self._heap_costs) >= self._HEAP_SAMPLES):
            return self.heap()
        costs = self._heap_costs = self._heap_costs or []
        t0 = time.perf_counter()
        value = self.heap()
        costs.append(time.perf_counter() - t0)
        if len(costs) == self._HEAP_SAMPLES:
            self.heap_on_writer = sorted(costs)[len(costs) // 2] > self.SLOW_HEAP_S
        return value

    def heap(self) -> int | None:
        """malloc'd bytes in use (arena chunks in use + mmapped chunks), None without glibc."""
        fn = self._mallinfo
        if fn is None:
            return None
        try:
            mi = fn()
            return int(mi.uordblks + mi.hblkhd)
        except Exception:
            MemoryProbe._mallinfo = None
            return None

    def rss(self) -> int:
        if self._statm is not None:
            try:
                return int(os.pread(self._statm, 128, 0).split()[1]) * self._page
            except (OSError, ValueError, IndexError):
                self._statm = None
        return int(self.proc.memory_info().rss)

    def snapshot(self, rss: int | None = None, heap: int | None = None,
                 cuda: dict[str, Any] | None = None, held: int | None = None
                 ) -> dict[str, Any]:
        """A ``memory`` row: ``rss``, ``heap`` and ``cuda`` as read at commit, or read now
        (an exception's event: the moment it was caught); ``held``: the recorder's own
        buffered bytes in that heap, read with it."""
        row: dict[str, Any] = {"rss_bytes": self.rss() if rss is None else rss,
                               "heap_bytes": self.heap() if heap is None else heap,
                               "recorder_heap_bytes": held}
        if self.counters is not None:
            row.update(cuda if cuda is not None else self.counters.now())
            row["cuda_total_bytes"] = self.total
        return row


class SystemSampler:
    """Samples CPU, memory and GPU utilisation every ``interval_s`` on a daemon thread."""

    def __init__(self, interval_s: float, emit, gpu: bool) -> None:
        self.interval_s = interval_s
        self.emit = emit  # callable(row dict); must not block
        self.gpu = gpu
        self._stop = threading.Event()
        self.proc = psutil.Process()
        self._thread = threading.Thread(target=self._run, name="tracealyze-sampler",
                                        daemon=True)

    def start(self) -> None:
        self.proc.cpu_percent(None)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.interval_s + 1)

    def _gpu_util(self) -> float | None:
        if not self.gpu:
            return None
        try:
            return float(torch.cuda.utilization())
        except Exception:  # no NVML: stop asking
            self.gpu = False
            return None

    def _run(self) -> None:
        # Prime the machine-wide counter here, on the thread that reads it: psutil (>= 5.9.6)
        # keeps cpu_percent(None)'s reference point per thread, so priming it on the caller's
        # thread left the first sample a meaningless 0.0.
        psutil.cpu_percent(None)
        while not self._stop.wait(self.interval_s):
            try:
                self.emit({
                    "time": time.time(),
                    "cpu_percent": psutil.cpu_percent(None),
                    "proc_cpu_percent": self.proc.cpu_percent(None),
                    "mem_percent": psutil.virtual_memory().percent,
                    "gpu_util": self._gpu_util(),
                })
            except Exception:
                pass  # a failed sample is simply missing; training must not notice
