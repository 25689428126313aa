"""What a CUDA out-of-memory error says, gathered for ``cuda_oom``: the numbers in the
exception's text, the memory rows before it, and the allocator's own snapshot.

The allocator's message names every number the diagnosis needs (PyTorch ≥ 2.1)::

    CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity of 139.80 GiB
    of which 261.12 MiB is free. Including non-PyTorch memory, this process has 139.54 GiB
    memory in use. Of the allocated memory 138.07 GiB is allocated by PyTorch, and 756.57
    MiB is reserved by PyTorch but unallocated. ...

and older releases (≤ 2.0) said ``Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total
capacity; 14.56 GiB already allocated; 3.12 MiB free; 14.68 GiB reserved in total by
PyTorch)``; ROCm builds say ``HIP out of memory`` with the same numbers.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ...gpu import allocsnap
from ...writes import Dir
from .base import Context

_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
          "PiB": 1 << 50, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_SIZE = r"([0-9]+(?:\.[0-9]+)?)\s*(bytes|B|KiB|MiB|GiB|TiB|PiB|KB|MB|GB|TB)\b"
# (2.1's first releases spelt "capacty"; ≤ 1.4 said "X cached" for reserved-but-unallocated;
# MPS says "MPS allocated: X ... max allowed: Y": tests/data/oom_messages.json, 48 messages
# users posted, holds each variant)
_CAPACITY = r"capac(?:i)?ty"
_PATTERNS = {
    "request_bytes": re.compile(r"Tried to allocate " + _SIZE),
    "total_bytes": re.compile(_CAPACITY + r" of " + _SIZE + r"|" + _SIZE + r" total "
                              + _CAPACITY + r"|max allowed: " + _SIZE),
    "free_bytes": re.compile(r"of which " + _SIZE + r" is free|" + _SIZE + r" free\b"),
    "allocated_bytes": re.compile(r"memory " + _SIZE + r" is allocated by PyTorch|"
                                  + _SIZE + r" already allocated|MPS allocated: " + _SIZE),
    "reserved_unallocated_bytes": re.compile(_SIZE + r" is reserved by PyTorch but "
                                             r"unallocated|" + _SIZE + r" cached\)"),
    "reserved_bytes": re.compile(_SIZE + r" reserved in total by PyTorch"),
    "process_bytes": re.compile(r"this process has " + _SIZE + r" memory in use"),
}


def parse_message(text: str) -> dict[str, int]:
    """The byte counts an OOM message states (keys of ``_PATTERNS`` that it has)."""
    out: dict[str, int] = {}
    for key, pat in _PATTERNS.items():
        m = pat.search(text or "")
        if m is None:
            continue
        groups = [g for g in m.groups() if g is not None]
        if len(groups) >= 2:
            out[key] = int(float(groups[0]) * _UNITS[groups[1]])
    if "reserved_unallocated_bytes" not in out and {"reserved_bytes", "allocated_bytes"} <= set(
            out):
        out["reserved_unallocated_bytes"] = max(
            out["reserved_bytes"] - out["allocated_bytes"], 0)
    return out


def is_oom_text(text: str) -> bool:
    """A device allocator's out-of-memory message (CUDA, HIP, XPU, MPS), not a host
    ``MemoryError``."""
    low = (text or "").lower()
    return ("tried to allocate" in low and ("out of memory" in low or "capac" in low)) or (
        "out of memory" in low and ("cuda" in low or "hip" in low or "gpu" in low))


@dataclass
class Oom:
    """One out-of-memory error on one rank."""

    rank: int
    step: int | None
    message: str
    numbers: dict[str, int]
    counters: dict[str, Any] = field(default_factory=dict)
    """The recorder's memory reading when the exception was caught (details.memory)."""


def ooms(ctx: Context) -> list[Oom]:
    """The exception events that are CUDA OOMs, first per rank."""
    rows = ctx.rows(
        "SELECT rank, step, message, details FROM events WHERE kind = 'exception' "
        "ORDER BY rank, time")
    out: dict[int, Oom] = {}
    for rank, step, message, details in rows:
        if rank in out or not is_oom_text(message or ""):
            continue  # (a host MemoryError is not the GPU's: memory_leak tells those)
        try:
            det = json.loads(details) if details else {}
        except ValueError:
            det = {}
        det = det if isinstance(det, dict) else {}
        mem = det.get("memory") if isinstance(det.get("memory"), dict) else {}
        out[int(rank)] = Oom(int(rank), None if step is None else int(step), message or "",
                             parse_message(message or ""), mem)
    return list(out.values())


def rows_are_per_step(ctx: Context) -> bool:
    """Whether the memory rows hold each step's own CUDA counters: recorded since they are
    read at the step's end (``cuda_max_allocated_bytes`` came with that; the views show the
    column, null, for older runs). Older runs read them when the writer flushed: a whole
    batch of rows holds one moment."""
    ((new, cuda),) = ctx.rows("SELECT count(cuda_max_allocated_bytes), "
                              "count(cuda_allocated_bytes) FROM memory")
    return new > 0 or cuda == 0


def allocated_series(ctx: Context, rank: int, before: int | None) -> tuple[list[int], list[int]]:
    """(steps, end-of-step cuda_allocated_bytes) of ``rank`` before step ``before``."""
    rows = ctx.rows(
        "SELECT step, cuda_allocated_bytes FROM memory WHERE rank = ? AND "
        "cuda_allocated_bytes IS NOT NULL AND (? IS NULL OR step < ?) ORDER BY step",
        [rank, before, before])
    return [int(s) for s, _ in rows], [int(v) for _, v in rows]


def snapshot(ctx: Context, rank: int) -> dict[str, Any] | None:
    """The summary of ``rank``'s last allocator snapshot, or None (none, or refused: the
    reason is kept under ``error``)."""
    files = [p for r, p in getattr(ctx.run, "snapshots", []) if r == rank]
    if not files:
        return None
    path = files[-1]

    def load() -> dict[str, Any]:
        try:
            data = _read_regular(path, allocsnap.MAX_BYTES)
            summary = allocsnap.summarize(allocsnap.decode(data, path.name))
        except (OSError, ValueError) as e:
            return {"file": _rel(ctx, path), "error": str(e).splitlines()[0] if str(e) else
                    type(e).__name__}
        summary["file"] = _rel(ctx, path)
        return summary

    return ctx.cached(f"allocsnap:{path}", load)


def _rel(ctx: Context, path: Any) -> str:
    try:
        return path.relative_to(ctx.run.run_dir).as_posix()
    except ValueError:
        return path.name


def _read_regular(path: Any, limit: int) -> bytes:
    """The file's bytes: opened without following a link, refused over ``limit``."""
    allocsnap.check_size(os.lstat(path).st_size, path.name, limit)
    with Dir.open(path.parent, create=False) as folder:
        data = folder.read_bytes(path.name, limit)
    if data is None:
        raise ValueError(f"memory snapshot {path.name}: not a regular file; not read")
    return data
