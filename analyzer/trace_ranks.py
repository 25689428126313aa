"""Which files a trace import reads, and which rank each trace belongs to.

``import-trace`` takes files and directories: a directory stands for the trace files in it
(``*.json``, ``*.json.gz``, searched recursively, hidden entries skipped, in name order), as
``torch.profiler.tensorboard_trace_handler`` leaves one per rank and profiling window. A
trace's rank is its ``distributedInfo.rank``; when the trace does not say, a rank in its file
name (``rank3``, ``rank_3``, ``rank-3``, ``worker3``, ``worker_3``), else 0.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tracealyze.format.parts import MAX_RANK

from .errors import TraceError
from .trace_fields import to_int

TRACE_SUFFIXES = (".json", ".json.gz")
_NAME_RANK = re.compile(r"(?:^|[^a-z])(?:rank|worker)[_-]?(\d{1,7})(?!\d)", re.IGNORECASE)


def trace_files(paths: Iterable[Path]) -> list[Path]:
    """``paths`` with each directory replaced by the trace files under it. TraceError for a
    path that does not exist or a directory without traces."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(
                f for f in p.rglob("*")
                if f.name.lower().endswith(TRACE_SUFFIXES) and f.is_file()
                and not any(part.startswith(".") for part in f.relative_to(p).parts)
            )
            if not found:
                raise TraceError(f"{p} holds no trace files (*.json, *.json.gz)")
            out.extend(found)
        elif p.exists():
            out.append(p)
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
        rank = to_int(dist.get("rank")) if isinstance(dist, dict) else None
        if rank is None:
            rank = rank_in_name(path)
        rank = rank if rank is not None else 0
    if not 0 <= rank <= MAX_RANK:
        raise TraceError(f"trace {path} has rank {rank}: a rank must be between 0 and "
                         f"{MAX_RANK}")
    return rank
