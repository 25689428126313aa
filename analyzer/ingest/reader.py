"""A trace's decompressed bytes as a guarded stream: counted, hashed, its first and last
megabyte kept for the metadata, and refused with one line when it is a decompression bomb,
larger than allowed, or (on the ijson pass) nested deeper than any profiler writes."""

from __future__ import annotations

import io
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TraceError
from .inflate import Inflater

READ_SIZE = 1 << 20
EDGE = 1 << 20
"""Bytes kept from the start and the end of the trace for its metadata."""
DEFAULT_MAX_RATIO = 200.0
"""Refuse a gzip trace that decompresses to more than this many times its size (Kineto
traces compress 5-30x; a 1 MB gzip bomb expands 2,000x) ..."""
BOMB_CHECK_BYTES = 256 << 20
"""... once it has produced this much (a small, very repetitive trace is fine)."""
MAX_DEPTH = 1024
"""Deepest nesting of arrays and objects read (Kineto nests five or six levels). msgspec, the
fast path, stops at Python's recursion limit (~1,000 levels) itself; ijson, the fallback,
has no limit and keeps a prefix string per level, so memory grows with the square of the
depth: a 400 KB trace of 200,000 ``[`` took 23 GB. The fallback counts brackets as they
pass (strings not excluded: a bracket in a name counts, which only makes the bound
stricter)."""



@dataclass
class Limits:
    """Guards against decompression bombs; ``None`` turns one off."""

    max_ratio: float | None = DEFAULT_MAX_RATIO
    """Most decompressed bytes per compressed byte of a gzip trace."""
    max_bytes: int | None = None
    """Most decompressed bytes of any trace."""
    check_after: int = BOMB_CHECK_BYTES
    """The ratio is checked once this many bytes came out."""


class GuardedReader(io.RawIOBase):
    """The trace's decompressed bytes for ijson, counted, hashed and guarded."""

    def __init__(self, path: Path, limits: Limits) -> None:
        self.path, self.limits = path, limits
        try:
            self._file = open(path, "rb")  # noqa: SIM115 (closed in close())
        except OSError as e:
            raise TraceError(f"cannot read trace {path}: {e.strerror or e}") from e
        self.gzip = self._file.read(2) == b"\x1f\x8b"
        self._file.seek(0)
        self._src = Inflater(self._file, self.gzip, path)
        self._piece, self._at = b"", 0  # the inflated piece being handed out, and where
        self._read_at = 0  # compressed bytes read when the current piece came out
        self.n = 0
        self.head = bytearray()
        self.tail = b""
        self.pushed = b""
        self.max_depth: int | None = None  # set for the ijson pass (see MAX_DEPTH)
        self._depth = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        n = len(data)
        b[:n] = data
        return n

    def read(self, size: int = -1) -> bytes:
        if size == 0:  # (ijson's probe: bytes or str?)
            return b""
        if self.pushed:  # given back by the form check, already counted
            data, self.pushed = self.pushed, b""
            return data
        if self._at >= len(self._piece):
            try:
                self._piece, self._read_at = next(self._src, (b"", self._read_at))
            except (EOFError, OSError, zlib.error) as e:
                if not self.gzip:
                    raise TraceError(f"cannot read trace {self.path}: {e}") from e
                raise TraceError(f"trace {self.path} is a truncated or corrupt gzip file "
                                 f"({e})") from e
            self._at = 0
        want = size if size and size > 0 else READ_SIZE
        # (a whole piece is handed out as it is: no copy on the usual 4 MB reads)
        whole = self._at == 0 and want >= len(self._piece)
        data = self._piece if whole else self._piece[self._at:self._at + want]
        self._at += len(data)
        self.n += len(data)
        if self.max_depth is not None:
            self._check_depth(data)
        if len(self.head) < EDGE:
            self.head += data[:EDGE - len(self.head)]
        self.tail = data[-EDGE:] if len(data) >= EDGE else (self.tail + data)[-EDGE:]
        self._guard()
        return data

    def _guard(self) -> None:
        lim = self.limits
        if lim.max_bytes is not None and self.n > lim.max_bytes:
            raise TraceError(f"trace {self.path} decompresses to more than {lim.max_bytes:,} "
                             "bytes (the limit set); raise it to import this trace")
        if self.gzip and lim.max_ratio is not None and self.n >= lim.check_after:
            ratio = self.n / max(self._read_at, 1)
            if ratio > lim.max_ratio:
                raise TraceError(
                    f"trace {self.path} expands {ratio:,.0f}x when decompressed (over "
                    f"{lim.max_ratio:g}x): refusing a possible decompression bomb; "
                    "use --max-ratio to import it anyway")

    def _check_depth(self, data: bytes) -> None:
        peak, self._depth = depth_scan(data, self._depth)
        if peak > (self.max_depth or 0):
            raise too_deep(self.path, self.max_depth or 0)

    @property
    def sha(self) -> Any:
        """SHA-1 of the decompressed bytes (complete once everything was read)."""
        return self._src.sha

    def close(self) -> None:
        self._src.close()
        self._file.close()
        super().close()


def depth_scan(data: bytes, start: int = 0) -> tuple[int, int]:
    """(deepest, final) bracket depth of ``data`` from depth ``start``; brackets inside
    strings count too (a bound, never an underestimate of the real nesting)."""
    b = np.frombuffer(data, np.uint8)
    if not len(b):
        return start, start
    step = ((b == 0x5B) | (b == 0x7B)).astype(np.int32)  # [ {
    step -= (b == 0x5D) | (b == 0x7D)  # ] }
    depth = start + np.cumsum(step)
    return max(start, int(depth.max())), int(depth[-1])


def too_deep(path: Path, limit: int) -> TraceError:
    return TraceError(f"trace {path} nests arrays or objects more than {limit} levels deep: "
                      "not a Chrome/Kineto trace")
