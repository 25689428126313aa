"""Raw profiler traces parsed once: the rows of each trace under a run's ``traces/`` kept in
the user's cache, so only the first command that opens the run pays for parsing (issue 43:
a 287 KB trace doubled ``summary`` of a 20M-row run; five 100 MB GPU windows would cost tens
of seconds per command).

An entry is keyed by what its rows depend on and nothing else: the trace's bytes (a BLAKE2b
digest, streamed), its file name (the trace id is built from it), the rank the run's folder
gives it, and :data:`CACHE_VERSION` with the analyzer's version (a parser change is a new
key). Size and modification time are part of the key too, so a file that changed is never
mistaken for its old self even before its digest is taken again. Being content-addressed,
the cache cannot be poisoned by a stranger's run: a run can only ever read back the rows
parsed from the very bytes it holds.

Entries live in ``<cache>/.traces/`` (the cache of :func:`.remote.cache_root`), written
through :mod:`..writes` (no link followed, atomic), bounded by
``$TRACEALYZE_TRACE_CACHE_MB`` (default 2048): the least recently used entries go first.
A cache that cannot be written is skipped (the trace is parsed, as without a cache);
``TRACEALYZE_TRACE_CACHE_MB=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..writes import Dir, OutputError

CACHE_VERSION = 1
"""Bumped when the rows parsed from a trace change for the same bytes."""
DEFAULT_MB = 2048
"""Default bound of the cache: a production run's few GPU windows (100 MB of JSON each, a
few MB of Parquet rows each) many times over, and small next to a disk of traces."""
FOLDER = ".traces"
_ID = b"tracealyze.trace_id"


def limit_bytes() -> int:
    """The cache's bound in bytes (``$TRACEALYZE_TRACE_CACHE_MB``; 0 turns it off)."""
    text = os.environ.get("TRACEALYZE_TRACE_CACHE_MB")
    if text is None or not text.strip():
        return DEFAULT_MB << 20
    try:
        mb = float(text)
    except ValueError:
        mb = -1.0
    if not mb >= 0 or mb == float("inf"):
        raise ConfigError(f"TRACEALYZE_TRACE_CACHE_MB must be a number of MB ≥ 0, got {text!r}")
    return int(mb * (1 << 20))


def key(path: Path, rank: int) -> str:
    """The entry name of ``path`` read as ``rank``'s trace."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("tracealyze")
    except PackageNotFoundError:  # (run from a source tree)
        ours = "0"
    st = os.stat(path)
    h = hashlib.blake2b(digest_size=20)
    h.update(f"{CACHE_VERSION}\0{ours}\0{rank}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    h.update(os.fsencode(path.name) + b"\0")
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class TraceCache:
    """The parsed rows of raw traces, by :func:`key`."""

    def __init__(self, root: Path | None = None) -> None:
        from .remote import cache_root

        self.limit = limit_bytes()
        self.base = root if root is not None else cache_root()
        self.root = self.base / FOLDER
        self._dir: Dir | None = None
        self.usable = self.limit > 0

    def _folder(self) -> Dir | None:
        if self._dir is None and self.usable:
            try:
                with Dir.open(self.base, create=True) as base:
                    self._dir = base.sub(FOLDER, mode=0o700)  # (never a link)
            except OutputError:
                self.usable = False
        return self._dir

    def trace_id(self, name: str) -> str | None:
        """The trace id of an entry seen before (rows or not), else None."""
        d = self._folder()
        raw = d.read_bytes(f"{name}.id", 4096) if d is not None else None
        return raw.decode("utf-8", "replace") if raw else None

    def rows(self, name: str) -> Any:
        """The parsed rows of an entry (a pyarrow.Table), else None."""
        d = self._folder()
        if d is None or d.kind(f"{name}.parquet") != "file":
            return None
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(d.path / f"{name}.parquet")
        except (OSError, pa.ArrowException):  # (torn by a full disk, or removed meanwhile)
            return None
        d.mark_used(f"{name}.parquet")
        d.mark_used(f"{name}.id")
        return table

    def keep(self, name: str, trace_id: str, table: Any = None) -> None:
        """Remember ``trace_id`` (and the parsed rows, when given) under ``name``."""
        d = self._folder()
        if d is None:
            return
        try:
            if table is not None:
                import pyarrow as pa
                import pyarrow.parquet as pq

                sink = pa.BufferOutputStream()
                pq.write_table(table, sink, compression="zstd")
                d.write_atomic(f"{name}.parquet", sink.getvalue().to_pybytes(), mode=0o600,
                               durable=False)
            d.write_atomic(f"{name}.id", trace_id.encode("utf-8"), mode=0o600, durable=False)
            self._evict(d)
        except (OSError, OutputError):
            self.usable = False  # (a full or read-only cache: parse as without one)

    def _evict(self, d: Dir) -> None:
        """Least recently used entries out until the cache is within its bound."""
        files = sorted(d.files(), key=lambda f: f[2])
        total = sum(size for _, size, _ in files)
        for name, size, _ in files:
            if total <= self.limit:
                break
            if name.endswith((".parquet", ".id")):
                d.remove(name)
                total -= size

    def close(self) -> None:
        if self._dir is not None:
            self._dir.close()
            self._dir = None
