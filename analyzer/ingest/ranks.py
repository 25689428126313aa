"""Which files a trace import reads, and which rank each trace belongs to.

``import-trace`` takes files and directories: a directory stands for the trace files in it
(``*.json``, ``*.json.gz``, searched recursively, hidden entries skipped, in name order), as
``torch.profiler.tensorboard_trace_handler`` leaves one per rank and profiling window. A
trace's rank is its ``distributedInfo.rank``; when the trace does not say, a rank in its file
name (``rank3``, ``rank_3``, ``rank-3``, ``worker3``, ``worker_3``), else 0.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import TraceError
from .fields import to_int

TRACE_SUFFIXES = (".json", ".json.gz")
_NAME_RANK = re.compile(r"(?:^|[^a-z])(?:rank|worker)[_-]?(\d{1,7})(?!\d)", re.IGNORECASE)


PEEK = 1 << 16


def looks_like_trace(path: Path) -> bool:
    """Whether the file's first 64 KiB (decompressed) hold ``"traceEvents"`` or start a bare
    event array: a directory's config.json or metrics.json is not read as a trace."""
    try:
        with open(path, "rb") as raw:
            head = raw.read(2)
            raw.seek(0)
            if head == b"\x1f\x8b":
                with gzip.open(raw) as f:
                    data = f.read(PEEK)
            else:
                data = raw.read(PEEK)
    except (OSError, EOFError, zlib.error):
        return True  # unreadable: let the reader say so, in one line
    return b'"traceEvents"' in data or data.lstrip()[:1] == b"["


def trace_files(paths: Iterable[Path], skipped: list[Path] | None = None) -> list[Path]:
    """``paths`` with each directory replaced by the trace files under it (JSON files in it
    that are not traces are left out, and listed in ``skipped``). TraceError for a path that
    does not exist or a directory without traces."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            candidates = sorted(
                f for f in p.rglob("*")
                if f.name.lower().endswith(TRACE_SUFFIXES) and f.is_file()
                and not any(part.startswith(".") for part in f.relative_to(p).parts)
            )
            found = [f for f in candidates if looks_like_trace(f)]
            if skipped is not None:
                skipped.extend(f for f in candidates if f not in found)
            if not found:
                raise TraceError(f"{p} holds no trace files (*.json, *.json.gz)")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        elif p.exists():  # a FIFO or a device would block the read, or never end it
            raise TraceError(f"{p} is not a regular file (a FIFO, device or socket)")
        else:
            raise TraceError(f"{p}: no such file or directory")
    seen: set[Path] = set()
    unique = []
    for f in out:  # the same file named twice (a dir and a file in it) is read once
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def rank_in_name(path: Path) -> int | None:
    """The rank a file name states (``..._rank3.pt.trace.json``, ``worker_3...``), if any."""
    m = _NAME_RANK.search(Path(path).name)
    return int(m.group(1)) if m else None


def rank_of_trace(path: Path, meta: dict[str, Any], rank: int | None = None) -> int:
    """``rank`` when given, else the trace's ``distributedInfo.rank``, else the rank in its
    file name, else 0; TraceError when it is out of range."""
    if rank is None:
        dist = meta.get("distributedInfo")
        given = dist.get("rank") if isinstance(dist, dict) else None
        rank = to_int(given)
        if given is not None and rank is None:
            raise TraceError(f"trace {path} has distributedInfo.rank {given!r}: not an "
                             "integer rank")
        if rank is None:
            rank = rank_in_name(path)
        rank = rank if rank is not None else 0
    from tracealyze.format.parts import MAX_RANK  # (4 ms of start-up: imported here)

    if not 0 <= rank <= MAX_RANK:
        raise TraceError(f"trace {path} has rank {rank}: a rank must be between 0 and "
                         f"{MAX_RANK}")
    return rank
