"""A trace file's decompressed bytes, produced by a background thread (issue 31).

Reading, gunzip and the SHA-1 of the decompressed bytes (the trace's id) are done in C with
the GIL released, so a thread does them while the main thread parses the previous chunk:
on a 174 MB trace they were 0.4 s of the import, now hidden behind the parse.

The thread runs at most :data:`AHEAD` chunks ahead (memory stays bounded), never inflates
more than :data:`OUT_CHUNK` bytes from one call (a decompression bomb cannot make one huge
buffer: the guards in :class:`.reader.GuardedReader` see every chunk), and stops when the
reader is closed. Multi-member gzip files and zero padding after a member are read as
:class:`gzip.GzipFile` reads them; CRC and length are checked by zlib.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

IN_CHUNK = 1 << 20
"""Compressed (or plain) bytes read from the file at a time."""
OUT_CHUNK = 4 << 20
"""Most decompressed bytes handed over in one piece."""
AHEAD = 4
"""Pieces the thread may hold ready: at most AHEAD x OUT_CHUNK bytes in flight."""


class Inflater:
    """Iterates over (decompressed bytes, compressed bytes read so far); ``sha`` is the
    SHA-1 of everything handed out once the iteration ends. Errors of the file or the
    compressed stream are raised from ``next()`` as ``OSError``/``EOFError``/``zlib.error``."""

    def __init__(self, f: BinaryIO, gz: bool, path: Path) -> None:
        self.sha = hashlib.sha1()
        self.path = path
        self._f, self._gz = f, gz
        self._q: queue.Queue[tuple[bytes, int] | BaseException | None] = queue.Queue(AHEAD)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tracealyze-inflate",
                                        daemon=True)
        self._thread.start()

    def __iter__(self) -> Inflater:
        return self

    def __next__(self) -> tuple[bytes, int]:
        item = self._q.get()
        if item is None:
            self._q.put(None)  # (a later next() ends too)
            raise StopIteration
        if isinstance(item, BaseException):
            self._q.put(item)
            raise item
        return item

    def close(self) -> None:
        """Stop the thread (it may be blocked on a full queue: make room until it ends)."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._q.get(timeout=0.05)
            except queue.Empty:
                pass

    def _put(self, item: tuple[bytes, int] | BaseException | None) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for data in (self._inflate() if self._gz else self._plain()):
                self.sha.update(data)  # (releases the GIL for buffers over 2 KB)
                if not self._put((data, self._f.tell())):
                    return
            self._put(None)
        except BaseException as e:  # handed to the reader, which words it
            self._put(e)

    def _plain(self) -> Iterator[bytes]:
        while chunk := self._f.read(IN_CHUNK):
            yield chunk

    def _inflate(self) -> Iterator[bytes]:
        d = zlib.decompressobj(31)
        while True:
            data = self._f.read(IN_CHUNK)
            if not data:
                break
            while data and not self._stop.is_set():
                if d.eof:  # another member, or zero padding, or garbage
                    data = data.lstrip(b"\0")
                    if not data:
                        break
                    if not data.startswith(b"\x1f\x8b"):
                        raise OSError(f"Not a gzipped file ({data[:2]!r})")
                    d = zlib.decompressobj(31)
                out = d.decompress(data, OUT_CHUNK)
                data = d.unconsumed_tail or d.unused_data
                if out:
                    yield out
            if self._stop.is_set():
                return
        while not d.eof:  # what the last input still holds
            out = d.decompress(d.unconsumed_tail, OUT_CHUNK) if d.unconsumed_tail else d.flush()
            if out:
                yield out
            elif not d.unconsumed_tail:
                raise EOFError("Compressed file ended before the end-of-stream marker was "
                               "reached")
