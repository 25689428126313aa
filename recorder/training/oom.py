"""The CUDA allocator's own snapshot, kept when training dies of an out-of-memory error.

PyTorch's memory snapshot (``torch.cuda.memory._snapshot()``, the pickle that
``_dump_snapshot`` writes and pytorch.org/memory_viz opens) holds every segment and block
the caching allocator has at that moment and, when allocation history is on
(``torch.cuda.memory._record_memory_history``), the last N allocations and frees with their
Python stacks. It is what GPU users reach for after an OOM, and it only exists in the dying
process: so the recorder takes it when a CUDA OOM leaves the ``with`` block (or reaches an
integration's exception hook) and writes it to
``memory_snapshots/rank=<r>/oom-step<NNNNNN>.pickle`` in the run directory, which is uploaded
like any part for URL runs.

History (knob ``memory_history``: how many entries the allocator keeps; 0 = off, on in the
debug preset) records a Python stack per allocation on the host; its measured cost on
GPT-2 small on an H200 was within the run's noise (../shared/gpu-runs/README.md). The
recorder turns it on only if the process has not already, and off at close only if it did.
Without history the snapshot still holds the segments and blocks (without stacks).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tracealyze.format.parts import SNAPSHOT_DIR, write_bytes_atomic

HISTORY_STACKS = "python"
"""Python frames only: C++ stacks cost far more to gather and symbolise."""
HISTORY_CONTEXT = "alloc"
"""Frames gathered at allocations only (frees are still in the history, without frames)."""


def is_cuda_oom(exc: BaseException) -> bool:
    """A CUDA out-of-memory error (``torch.OutOfMemoryError``, or a RuntimeError that says
    so, as older releases and some extensions raise)."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(
        torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    text = str(exc).lower()
    return "cuda" in text and "out of memory" in text


class OomSnapshots:
    """Allocation history while recording; the snapshot at a CUDA OOM."""

    def __init__(self, run_dir: Path, rank: int, device: torch.device | None,
                 history_entries: int, info: Callable[[str, dict[str, Any]], None],
                 start_at: float = 0.0, probe: Any = None) -> None:
        """``start_at``: the share of the device's memory reserved from which the history
        starts, read on ``probe``'s counters (sampler.MemoryProbe); 0 starts it now."""
        self.dir = Path(run_dir) / SNAPSHOT_DIR / f"rank={rank}"
        self.cuda = (device is not None and device.type == "cuda"
                     and torch.cuda.is_available())
        self.device = device
        self._info = info
        self._ours = False  # history turned on by us (so turned off by us at close)
        self.written: list[Path] = []
        # (entries, reserved bytes from which to start) while the history waits for them
        self.armed: tuple[int, float] | None = None
        if self.cuda and history_entries > 0:
            total = getattr(probe, "total", None)
            if start_at > 0 and total:
                self.armed = (history_entries, start_at * total)
                probe.on_counters = self.at_counters
            else:
                self._start_history(history_entries)

    def at_counters(self, row: dict[str, Any]) -> None:
        """A memory row's CUDA counters (training thread, at commit): start the armed
        history once the allocator has reserved its share of the device."""
        armed = self.armed
        reserved = row.get("cuda_reserved_bytes")
        if armed is None or reserved is None or reserved < armed[1]:
            return
        self.armed = None
        self._start_history(armed[0])
        if self._ours:
            gib = 1 << 30
            self._info(f"CUDA allocation history on from here: the allocator reserved "
                       f"{reserved / gib:.1f} GiB (the threshold: {armed[1] / gib:.1f} GiB); "
                       "an OOM's snapshot will hold the stacks of allocations from now",
                       {"reserved_bytes": int(reserved)})

    def _start_history(self, entries: int) -> None:
        memory = torch.cuda.memory
        enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
        if enabled is not None and enabled():
            return  # the user's own recording: leave it as they set it
        # context="alloc": a stack is gathered at each allocation, not at frees too: the
        # snapshot's live blocks and the history's allocations keep their frames (what the
        # analyzer reads), at about half the per-allocation cost of "all".
        memory._record_memory_history(max_entries=int(entries), context=HISTORY_CONTEXT,
                                      stacks=HISTORY_STACKS)
        self._ours = True

    def remove(self) -> None:
        """Stop the history this recorder started (close; never raises)."""
        if self._ours:
            self._ours = False
            try:
                torch.cuda.memory._record_memory_history(enabled=None)
            except Exception:
                pass

    def at_exception(self, exc: BaseException, step: int) -> Path | None:
        """Write the allocator's snapshot if ``exc`` is a CUDA OOM; the file, or None."""
        if not self.cuda or not is_cuda_oom(exc):
            return None
        snap = torch.cuda.memory._snapshot(self.device)
        path = self._write(snap, step)
        self.written.append(path)
        segments = snap.get("segments", []) if isinstance(snap, dict) else []
        traces = snap.get("device_traces", []) if isinstance(snap, dict) else []
        self._info(
            f"CUDA allocator snapshot at the out-of-memory error: {path.name} "
            f"({len(segments)} segments, {sum(len(t) for t in traces)} history entries); "
            "open it at pytorch.org/memory_viz",
            {"path": path.relative_to(self.dir.parent.parent).as_posix(),
             "segments": len(segments), "history_entries": sum(len(t) for t in traces)})
        return path

    def _write(self, snap: Any, step: int) -> Path:
        path = self.dir / f"oom-step{max(step, 0):06d}.pickle"
        write_bytes_atomic(path, pickle.dumps(snap, protocol=4))  # (our own dict: PyTorch's)
        return path
