"""Where a step's wall time went on the host: the process's CPU time, and how long the
training thread was ready to run but waited for a free CPU.

A slow step is the training's own when the process was busy with its own work (a
synchronous checkpoint, a GC pass) or idle by itself (blocking I/O, a lock, a child
process); it is the machine's when other processes held the CPUs. The 1 s system samples
cannot tell these apart for a stall shorter than a sample, and the process's CPU time alone
cannot either (a thread pre-empted by another process accrues no CPU time, just like one
blocked on I/O). The scheduler's run-queue delay of the training thread can: it grows only
while the thread is runnable and kept off every CPU.

Both are cheap reads per step on the training thread (``clock_gettime`` and one ``pread`` of
``/proc/thread-self/schedstat``: ~6 µs a lap with the wall clock, measured on a loaded 2-core
VM), no sync with any device and no file opened after the first step.
"""

from __future__ import annotations

import os
import threading
import time


class StepClock:
    """Per-step host CPU figures: :meth:`lap` returns the step's end (wall time) with the
    process CPU seconds and training-thread run-queue seconds since the previous lap; the
    run-queue figure is None where the kernel does not expose it (not Linux, schedstat
    unavailable)."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._tid: int | None = None
        self._queue_ok = True
        self._last_cpu = time.process_time()
        self._last_queue = self._queue()

    def _queue(self) -> float | None:
        """The calling thread's total run-queue wait in seconds (Linux schedstat: on-CPU ns,
        run-queue ns, timeslices), None when unavailable. The file is opened once per
        thread: ``thread-self`` resolves to the thread that opens it."""
        if not self._queue_ok:
            return None
        try:
            tid = threading.get_ident()
            if self._fd is None or tid != self._tid:
                self.close()
                self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
                self._tid = tid
            return int(os.pread(self._fd, 96, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            self._queue_ok = False  # no schedstat here: the column stays null
            self.close()
            return None

    def lap(self) -> tuple[float, float, float | None]:
        """(wall time now, process CPU seconds and training-thread run-queue seconds since
        the last lap). The reads are ordered so that a pre-emption lands whole in one step:
        the kernel switches a thread out on its way back from a system call, so whatever it
        waits after the CPU-time call is in this step's wall time and run-queue figure (both
        read after it), and after the schedstat read in the next step's (both read before
        it). The wall clock (vDSO, no system call) sits between them. A thread change (a
        framework calling from another thread) gives no queue figure for that lap: the two
        counters belong to different threads."""
        cpu = time.process_time()
        now = time.time()
        tid = self._tid
        queue = self._queue()
        d_cpu = max(0.0, cpu - self._last_cpu)
        d_queue = (max(0.0, queue - self._last_queue)
                   if queue is not None and self._last_queue is not None and tid == self._tid
                   else None)
        self._last_cpu, self._last_queue = cpu, queue
        return now, d_cpu, d_queue

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
