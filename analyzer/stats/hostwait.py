"""Whose a slow step is, from the recorder's per-step host figures (``steps.cpu_queue_s``:
how long the training thread was runnable but kept off every CPU; ``steps.cpu_s``: the
process's CPU time).

A step's wall time is the training thread's time on a CPU, in the scheduler's run queue, and
blocked (I/O, a lock, a child process, a device sync). Other processes that take the CPUs
show as run-queue wait; nothing the training does by itself does (on a machine it has to
itself). So the excess time of a slow step is the machine's when the thread waited for a CPU,
beyond the run's usual share of such waiting, for a good part of it; otherwise the stall is
the training's own: its own CPU work (a synchronous checkpoint, a GC pass, an evaluation)
when the process's CPU time grew with it, idle by itself when it did not.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MACHINE_SHARE = 0.25
"""A slow step is the machine's when the run-queue wait beyond the run's usual share covers
at least this share of its excess time. Measured (2 cores, 1-3 busy competitors): a single
thread pre-empted by others waits ~50-100% of its excess time in the queue; a 2-thread
intra-op pool ~60% (the rest is the main thread spinning on its pre-empted workers). The
training's own stall waits ~0% beyond the usual, however busy the machine is all run (its
own CPU work queues at the run's usual share, which is subtracted; blocked time never
queues). A quarter sits between the two with a margin both ways."""


def rebook(dur: np.ndarray, queue: np.ndarray) -> np.ndarray:
    """Run-queue seconds per step, none exceeding its step's wall time: a wait booked to a
    step that it cannot fit (a pre-emption between the recorder's reads of the wall clock
    and of the run queue, in runs recorded before they were read in one order) belongs to
    the next step, whose wall time holds it. Consecutive steps, in step order."""
    q = np.array(queue, dtype=np.float64)
    d = np.asarray(dur, dtype=np.float64)
    for i in np.flatnonzero(np.isfinite(q[:-1]) & np.isfinite(d[:-1]) & (q[:-1] > d[:-1])):
        if q[i] > d[i] and np.isfinite(q[i + 1]):  # (a surplus carried in may cascade)
            q[i + 1] += q[i] - d[i]
            q[i] = d[i]
    return q


def split(dur: np.ndarray, queue: np.ndarray, cpu: np.ndarray, out: np.ndarray,
          med: float) -> dict[str, Any] | None:
    """Over the judged steps (``out``: the slow ones; ``med``: the median step): which slow
    steps are the machine's (``machine``, a mask over the slow ones), the queue share of
    their excess time, and the share of the training's own stalls' excess that was CPU work
    of the process. None where the run has no run-queue figures for every slow step and
    most typical ones (not Linux; a run recorded before 2026-11-29)."""
    typ = ~out & np.isfinite(queue) & np.isfinite(dur) & (dur > 0)
    if not out.any() or not np.isfinite(queue[out]).all() or typ.sum() < max(
            5, 0.5 * (~out).sum()):
        return None
    usual = float(np.median(queue[typ] / dur[typ]))  # the run's usual share of CPU waiting
    d, q = dur[out], queue[out]
    excess = np.maximum(d - med, 1e-12)
    beyond = q - usual * d
    machine = beyond >= MACHINE_SHARE * excess
    own = ~machine
    # each slow step's CPU work beyond the typical step's, over its excess time (NaN where
    # the run has no CPU figures)
    busy = np.full(len(d), np.nan)
    if np.isfinite(cpu[typ]).any():
        busy = np.maximum(cpu[out] - float(np.nanmedian(cpu[typ])), 0.0) / excess
    wait_share = (float(beyond[machine].sum() / excess[machine].sum())
                  if machine.any() else None)
    return {"machine": machine, "wait_share": wait_share,
            "own_cpu_share": cpu_share_of(busy, excess, own), "cpu_busy": busy,
            "excess": excess}


def cpu_share_of(busy: np.ndarray, excess: np.ndarray, which: np.ndarray) -> float | None:
    """The share of the ``which`` slow steps' excess time that was the process's own CPU
    work (None without CPU figures for each of them)."""
    if not which.any() or not np.isfinite(busy[which]).all():
        return None
    return float((busy[which] * excess[which]).sum() / excess[which].sum())


def own_kind(cpu_share: float | None) -> str:
    """What the training did during its own stalls, as a clause."""
    if cpu_share is None:
        return ""
    if cpu_share >= 0.5:
        return (" The process was busy on the CPU during them (its own work: serialising a "
                "checkpoint, a garbage-collection pass, an evaluation, logging).")
    return (" The process sat idle during them, not waiting for a CPU (blocking I/O, a lock,"
            " waiting on a child process or on the device).")
