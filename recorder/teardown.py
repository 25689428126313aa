"""Taking a recorder's hooks and threads back out of the training process: at close, and
after a start that failed half-way (when any of them may not exist yet). ``rec`` is the
:class:`~.recorder.Recorder` (not imported here: it imports this module)."""

from __future__ import annotations

from typing import Any

from .tensors import anomaly, clipping
from .tensors.hooks import remove_all


def abandon(rec: Any, resume: bool) -> None:
    """Take back what a start that failed half-way installed: hooks, threads, and for a new
    run the metadata files its constructor wrote (no step was recorded yet), so that a
    retry is not refused; a resumed run is marked crashed."""
    if rec._life is not None:
        rec._life.closed = True
    try:
        rec._teardown_hooks()
    except Exception:
        pass
    sampler, writer = getattr(rec, "_sampler", None), getattr(rec, "_writer", None)
    try:
        if sampler is not None:
            sampler.stop()
        if writer is not None:
            writer.close()
        if rec._spool is not None:
            rec._spool.close(0.0)
        if resume:
            rec._rundir.write(rec._counters(), status="crashed")
            rec._rundir.lock.release()
        else:
            rec._rundir.discard()
    except Exception:
        pass


def teardown_hooks(rec: Any) -> None:
    """Remove every hook the recorder installed."""
    # (also after a start that failed half-way: any of these may not exist yet)
    life = rec._life
    remove_all([*getattr(rec, "_handles", ()), life and life.act, life and life.amp,
                getattr(rec, "_process", None), getattr(rec, "_oom", None)])
    rec._handles = []
    clipping.uninstall(id(rec))
    anomaly.stop(rec)
