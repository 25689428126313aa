"""The byte ranges of one object in a store that a run read in place has fetched
(:mod:`.inplace`): a sparse local file and the list of the ranges it holds, and a
read-only file object over them for DuckDB and pyarrow.

A range is listed only after its bytes are on disk (fsync); two commands filling one cache
write the same bytes (the file is named after the object's size and time, so another
version of the object is another file). A cache that cannot be written is skipped: the
bytes are then served from memory.
"""

from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path
from typing import Any

from tracealyze.format.storage import Location, StoredFile

from ..errors import StoreError

RANGES = ".ranges"
"""The folder of a mirror that holds the fetched ranges of its parts."""
BLOCK = 256 * 1024
"""Fetches are rounded out to this alignment: Parquet readers ask for a footer's last 8
bytes, then the footer, then column chunks; one GET of a few hundred KiB costs about what a
GET of 8 bytes does, and what it brings along is usually asked for next."""


class RangeCache:
    """One object's fetched byte ranges: a sparse local file and the list of what it holds."""

    def __init__(self, loc: Location, f: StoredFile, root: Path) -> None:
        self.loc, self.f, self.root = loc, f, root
        self.data = root / f"{f.rel}@{f.size}-{f.mtime_ns or 0}"
        self.index = self.data.with_name(self.data.name + ".json")
        self.lock = threading.Lock()
        self.have = self._load()
        self.remote: Any = None
        self.writable = True

    def _load(self) -> list[tuple[int, int]]:
        try:
            got = json.loads(self.index.read_text())
            ranges = [(int(a), int(b)) for a, b in got]
        except (OSError, ValueError, TypeError):
            return []
        if not self.data.is_file() or any(not 0 <= a < b <= self.f.size for a, b in ranges):
            return []
        return _merge(ranges)

    def read(self, offset: int, n: int) -> bytes:
        end = min(offset + max(n, 0), self.f.size)
        if offset >= end:
            return b""
        with self.lock:
            if any(a <= offset and end <= b for a, b in self.have):
                try:
                    with open(self.data, "rb") as fh:
                        fh.seek(offset)
                        got = fh.read(end - offset)
                    if len(got) == end - offset:
                        return got
                except OSError:  # (the cache was deleted meanwhile: fetch again)
                    pass
                self.have = []
            a = offset // BLOCK * BLOCK
            b = min(self.f.size, -(-end // BLOCK) * BLOCK)
            data = self._fetch(a, b)
            self._keep(a, data)
            return data[offset - a:end - a]

    def _fetch(self, a: int, b: int) -> bytes:
        """Bytes a..b of the object: one ranged GET (a HEAD first, to open it)."""
        path = self.loc.path(self.f.rel)
        try:
            if self.remote is None:
                self.remote = self.loc.fs.open_input_file(path)
            return bytes(self.remote.read_at(b - a, a))
        except OSError as e:
            from pyarrow import fs as pafs

            # each store words "gone" its own way (S3's NO_SUCH_KEY on a file opened
            # before): ask. Gone means merged away, and live.vanished reads this text.
            try:
                gone = self.loc.fs.get_file_info(path).type == pafs.FileType.NotFound
            except OSError:
                gone = False
            if gone:
                raise FileNotFoundError(f"No such file: {self.loc.url}/{self.f.rel}") \
                    from None
            raise StoreError(f"cannot read {self.loc.url}/{self.f.rel}: "
                             f"{' '.join(str(e).split())[:300]}") from None

    def _keep(self, a: int, data: bytes) -> bool:
        """Write ``data`` at ``a`` into the cache, then list it; False if it cannot. The
        cache's folders are opened without following links (:mod:`..writes`)."""
        if not self.writable:
            return False
        from ..writes import OutputError, open_path

        try:
            with open_path(self.root, self.data.parent.relative_to(self.root).as_posix()) \
                    as folder:
                # never truncated on open: another command may be filling the same file
                with folder.open_update(self.data.name) as fh:
                    if os.fstat(fh.fileno()).st_size < self.f.size:
                        fh.truncate(self.f.size)  # sparse: unfetched ranges take no disk
                    fh.seek(a)
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())  # the bytes are on disk before the list says so
                self.have = _merge([*self.have, (a, a + len(data))])
                folder.write_atomic(self.index.name, json.dumps(self.have), mode=0o600,
                                    durable=False)  # (the data it lists was fsynced)
            return True
        except (OSError, OutputError):  # a full or read-only cache: serve from memory
            self.writable = False
            return False


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def prune(folder: Path, current: list[StoredFile]) -> None:
    """Remove cached ranges of objects the store no longer has in that version."""
    root = folder / RANGES
    if not root.is_dir():
        return
    keep = {f"{f.rel}@{f.size}-{f.mtime_ns or 0}" for f in current}
    for path in sorted(root.rglob("*"), reverse=True):
        rel = path.relative_to(root).as_posix()
        base = rel[:-5] if rel.endswith(".json") else rel
        if path.is_file() and not path.is_symlink() and base not in keep:
            path.unlink(missing_ok=True)


class RangeFile(io.RawIOBase):
    """A read-only, seekable file over a :class:`RangeCache`."""

    def __init__(self, cache: RangeCache) -> None:
        super().__init__()
        self.cache, self.pos = cache, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.cache.f.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def size(self) -> int:
        return self.cache.f.size

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.cache.f.size - self.pos
        data = self.cache.read(self.pos, n)
        self.pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buf: Any) -> int:
        data = self.read(len(buf))
        buf[:len(data)] = data
        return len(data)
