"""run.json and ranks/rank=<r>.json: run metadata, status, heartbeat, and the liveness rule.

The recorder writes run.json (rank 0) and its own rank file at start, before any data, and
rewrites both after every flush (at least once per ``flush_interval_s``, data or not): the
``heartbeat``. A rank whose status is still ``running`` but whose heartbeat is older than
:func:`stale_after_s` was killed without a chance to say so (``kill -9``, OOM killer, node
lost). Younger than that, the run is in progress.
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from .schema import SCHEMA_VERSION

STALE_FLUSHES: float = 3.0
"""A running rank is presumed killed after this many missed heartbeats ..."""
STALE_SLACK_S: float = 30.0
"""... plus this much slack (a flush of a large step, a slow disk, clock skew)."""

MAX_JSON_BYTES = 64 * 1024 * 1024
"""run.json larger than this is not a run's metadata (refused, not parsed)."""

STATUSES = ("running", "completed", "crashed")


class MetaError(ValueError):
    """run.json (or a rank file) cannot be read as run metadata."""


def stale_after_s(flush_interval_s: Any) -> float:
    """Heartbeat age beyond which a ``running`` rank is presumed killed:
    ``3 × flush_interval_s + 30 s`` (60 s at the default 10 s interval)."""
    try:
        interval = float(flush_interval_s)
    except (TypeError, ValueError):
        interval = 10.0
    if not math.isfinite(interval) or interval <= 0:
        interval = 10.0
    return STALE_FLUSHES * interval + STALE_SLACK_S


def load_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; MetaError (one line) for anything else, including a
    file nested too deep to parse or too large to be metadata."""
    try:
        if os.path.getsize(path) > MAX_JSON_BYTES:
            raise MetaError(f"{path} is larger than {MAX_JSON_BYTES >> 20} MiB: not run metadata")
        with open(path, "rb") as fh:
            data = json.loads(fh.read())
    except MetaError:
        raise
    except RecursionError:
        raise MetaError(f"{path} is nested too deeply to be run metadata") from None
    except (OSError, ValueError) as e:
        raise MetaError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise MetaError(f"{path} does not hold a JSON object")
    return data


def read_json(path: Path) -> dict[str, Any] | None:
    """:func:`load_json`, or None where it fails."""
    try:
        return load_json(path)
    except MetaError:
        return None


def new_run_meta(*, preset: str | None, knobs: dict[str, Any] | None, world_size: int,
                 versions: dict[str, Any] | None = None, model: dict[str, Any] | None = None,
                 device: dict[str, Any] | None = None, flush_interval_s: float | None = None,
                 source: str = "recorder", status: str = "running") -> dict[str, Any]:
    """The run.json of a new run (the recorder's, or import-trace's ``source``)."""

    now = time.time()
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": uuid.uuid4().hex,
        "source": source,
        "started": now,
        "started_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)),
        "ended": None if status == "running" else now,
        "status": status,
        "heartbeat": now,
        "flush_interval_s": flush_interval_s,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "cpu_count": os.cpu_count(),
        "world_size": world_size,
        "versions": {"python": platform.python_version(), "platform": sys.platform,
                     **(versions or {})},
        "preset": preset,
        "knobs": knobs,
        "model": model,
        "device": device,
        "resumes": [],
        "counters": {"dropped": {}, "recorder_errors": 0},
    }


def new_rank_meta(rank: int, host: str | None = None) -> dict[str, Any]:
    """A rank file's first state. ``host`` is the machine this rank runs on (this process's
    by default): each rank names its own, since ranks of one run span nodes and a resumed
    rank may run on another node than the one that started the run."""
    now = time.time()
    return {
        "rank": rank,
        "status": "running",
        "started": now,
        "ended": None,
        "heartbeat": now,
        "host": host if host is not None else socket.gethostname(),
        "pid": os.getpid(),
        "steps": 0,
        "counters": {"dropped": {}, "recorder_errors": 0},
    }


def as_float(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


class Liveness:
    """Whether a run (run.json plus its rank files) is running, finished or was killed."""

    def __init__(self, meta: dict[str, Any], ranks: dict[int, dict[str, Any]],
                 now: float | None = None) -> None:
        self.meta = meta
        self.ranks = ranks
        self.now = time.time() if now is None else now
        self.stale_after_s = stale_after_s(meta.get("flush_interval_s") or 10.0)

    @property
    def status(self) -> str:
        """``crashed`` if any rank crashed, else ``running`` if any rank runs, else
        ``completed`` (a killed run stays ``running``: see :attr:`killed`)."""
        statuses = [str(m.get("status", "")) for m in self.ranks.values()]
        if not statuses:
            s = str(self.meta.get("status", "running"))
            return s if s in STATUSES else "running"
        if "crashed" in statuses:
            return "crashed"
        if "running" in statuses:
            return "running"
        return "completed"

    def heartbeat(self, rank: int | None = None) -> float | None:
        """Last heartbeat (epoch s) of ``rank``, or the newest of all; None if unknown."""
        if rank is not None and rank in self.ranks:
            sources = [self.ranks[rank]]
        else:
            sources = [*self.ranks.values(), self.meta]
        beats = [b for b in (as_float(m.get("heartbeat")) for m in sources) if b is not None]
        return max(beats) if beats else None

    def age_s(self, rank: int | None = None) -> float | None:
        hb = self.heartbeat(rank)
        return None if hb is None else max(0.0, self.now - hb)

    def stale_ranks(self, max_age_s: float | None = None) -> list[int]:
        """Ranks still marked running whose heartbeat is older than ``max_age_s`` (default
        :attr:`stale_after_s`)."""
        limit = self.stale_after_s if max_age_s is None else max_age_s
        if not self.ranks:
            age = self.age_s()
            running = self.meta.get("status") == "running"
            return [0] if running and age is not None and age > limit else []
        out = []
        for r, m in sorted(self.ranks.items()):
            age = self.age_s(r)
            if m.get("status") == "running" and age is not None and age > limit:
                out.append(r)
        return out

    @property
    def killed(self) -> bool:
        """Marked running, but a running rank's heartbeat is stale: killed without a word."""
        return self.status == "running" and bool(self.stale_ranks())

    @property
    def in_progress(self) -> bool:
        return self.status == "running" and not self.killed
