"""Every request to an object store ends within a bound: ``TRACEALYZE_STORE_TIMEOUT_S``
seconds (default 20).

A store that accepts connections and never answers held a command for ~100 s before its
one-line error (pyarrow's S3 client as ``from_uri`` makes it: 3 s read timeouts, tried 31
times), and for minutes on ``gs://`` (a stalled request is given up after 120 s, then
retried) and ``az://`` (60 s a try, retried).

- S3 is bounded natively: the client's connect and read timeouts and its retry strategy are
  chosen so that attempts × (connect + read) + the back-offs between them stay within the
  bound (:func:`s3_settings`). The read timeout is curl's low-speed limit (no byte for that
  many seconds), so a large transfer that keeps moving is never cut off.
- GCS and Azure clients offer no such knobs in pyarrow (GCS bounds only its retries, which
  :func:`gcs_retry_s` sets): every call runs in a worker thread that is waited for at most
  the bound (:func:`bounded`). Reads and writes go in :data:`CHUNK` pieces, each bounded,
  so here too only a transfer that stalls is given up, not one that is merely long. The
  abandoned thread ends when the client gives up on its own; it is a daemon, so it never
  holds the process at exit. A listing is one call: bounded as a whole.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from pyarrow import fs as pafs

ENV = "TRACEALYZE_STORE_TIMEOUT_S"
DEFAULT_S = 20.0
MIN_S = 2.0
"""A try needs a second to connect and one to answer: the clients count whole seconds."""
MAX_S = 86400.0
"""A day: beyond, a wait is not a bound (and thread waits overflow on some platforms)."""
CHUNK = 1 << 20
"""Bytes read or written per bounded call on GCS and Azure: a store moving less than this
in the bound is taken for stalled (1 MiB in 20 s: ~50 KB/s)."""
T = TypeVar("T")


def timeout_s() -> float:
    """The bound, from ``TRACEALYZE_STORE_TIMEOUT_S``; ValueError (one line) for a value that
    is not a number of seconds in [MIN_S, MAX_S]."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return DEFAULT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not MIN_S <= value <= MAX_S:  # (False for nan)
        raise ValueError(f"{ENV}={text!r}: expected seconds between {MIN_S:g} and {MAX_S:g} "
                         "(how long a request to an object store may go unanswered)")
    return value


def s3_settings(bound: float) -> tuple[int, float, float]:
    """(attempts, connect timeout, read timeout) for pyarrow's S3 client whose worst case
    stays within ``bound``. Its standard retry strategy waits up to 1 s, then up to 2 s,
    between attempts. Three attempts (the AWS default: a 503 SlowDown is retried) while
    each keeps the SDK's own 3 s read timeout, fewer under a tighter bound."""
    attempts, per_try = 1, bound
    for n in (3, 2):
        if (bound - (2 ** (n - 1) - 1)) / n >= 4.0:
            attempts, per_try = n, (bound - (2 ** (n - 1) - 1)) / n
            break
    connect = min(per_try / 2, max(1.0, per_try - 3.0))
    return attempts, connect, per_try - connect


def bounded_s3(fs: Any, bound: float) -> Any:
    """``fs`` (an S3FileSystem as ``from_uri`` made it: its endpoint, region, credentials)
    again, with the timeouts and retries of :func:`s3_settings`. Its options are read as
    pickling reads them (``__reduce__``); the retry strategy is not among them."""
    attempts, connect, read = s3_settings(bound)
    options = dict(fs.__reduce__()[1][0])
    options.update(connect_timeout=connect, request_timeout=read,
                   retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=attempts))
    return pafs.S3FileSystem(**options)


def gcs_retry_s(bound: float) -> int:
    """GCS's retry time limit (whole seconds): its retries end within the bound, so a thread
    given up on by :func:`call` does not go on retrying for the client's default 15 min."""
    return max(1, int(bound))


def gcs_retry(bound: float) -> timedelta:
    return timedelta(seconds=gcs_retry_s(bound))


def call(fn: Callable[[], T], bound: float, what: str) -> T:
    """``fn()`` in a worker thread, waited for at most ``bound`` s. TimeoutError (an OSError:
    one line at the CLI, a retry for the recorder's uploader) when it has not returned."""
    done = threading.Event()
    out: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            out.append((True, fn()))
        except BaseException as e:  # (handed to the caller's thread)
            out.append((False, e))
        finally:
            done.set()

    # A daemon thread, not a pool's: concurrent.futures joins its workers at exit, and one
    # a frozen store never answers would hold the process there.
    threading.Thread(target=run, name="tracealyze-store", daemon=True).start()
    if not done.wait(bound):
        raise TimeoutError(f"the store did not answer within {bound:g} s ({what}; "
                           f"{ENV} sets the bound)")
    ok, value = out[0]
    if ok:
        return value  # type: ignore[no-any-return]
    raise value


def bounded(fs: Any, bound: float, name: str) -> Any:
    """``fs`` (a GCS or Azure filesystem) as a pyarrow filesystem whose every call ends
    within ``bound`` s. ``name`` (the URL's scheme) goes into the timeout's message."""
    return pafs.PyFileSystem(_Deadline(fs, bound, name))


class _Deadline(pafs.FileSystemHandler):  # type: ignore[misc]
    """A pyarrow filesystem handler: each call to the inner filesystem through :func:`call`.
    Compression is left to the outer filesystem (it detects ``.gz`` as the inner one
    would): the inner streams are opened raw."""

    def __init__(self, fs: Any, bound: float, name: str) -> None:
        self.fs, self.bound, self.name = fs, bound, name

    def run(self, what: str, fn: Callable[[], T]) -> T:
        return call(fn, self.bound, f"{what} on {self.name}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Deadline) and self.fs.equals(other.fs)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def get_type_name(self) -> str:
        return f"bounded+{self.fs.type_name}"

    def normalize_path(self, path: str) -> str:
        return str(self.fs.normalize_path(path))

    def get_file_info(self, paths: list[str]) -> list[Any]:
        return self.run(f"looking up {paths[0] if paths else ''}",
                        lambda: self.fs.get_file_info(paths))

    def get_file_info_selector(self, selector: Any) -> list[Any]:
        return self.run(f"listing {selector.base_dir}", lambda: self.fs.get_file_info(selector))

    def create_dir(self, path: str, recursive: bool) -> None:
        self.run(f"creating {path}", lambda: self.fs.create_dir(path, recursive=recursive))

    def delete_dir(self, path: str) -> None:
        self.run(f"deleting {path}", lambda: self.fs.delete_dir(path))

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.run(f"emptying {path}", lambda: self.fs.delete_dir_contents(
            path, missing_dir_ok=missing_dir_ok))

    def delete_root_dir_contents(self) -> None:
        self.run("emptying the root", lambda: self.fs.delete_dir_contents(
            "/", accept_root_dir=True))

    def delete_file(self, path: str) -> None:
        self.run(f"deleting {path}", lambda: self.fs.delete_file(path))

    def move(self, src: str, dest: str) -> None:
        self.run(f"moving {src}", lambda: self.fs.move(src, dest))

    def copy_file(self, src: str, dest: str) -> None:
        self.run(f"copying {src}", lambda: self.fs.copy_file(src, dest))

    def open_input_stream(self, path: str) -> Any:
        return self._reader(path, self.run(f"opening {path}", lambda: self.fs.open_input_stream(
            path, compression=None)))

    def open_input_file(self, path: str) -> Any:
        return self._reader(path, self.run(f"opening {path}",
                                           lambda: self.fs.open_input_file(path)))

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        return self._writer(path, self.run(f"opening {path}", lambda: self.fs.open_output_stream(
            path, compression=None, metadata=metadata)))

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return self._writer(path, self.run(f"opening {path}", lambda: self.fs.open_append_stream(
            path, compression=None, metadata=metadata)))

    def _reader(self, path: str, f: Any) -> Any:
        import pyarrow as pa

        return pa.PythonFile(_Reader(self, path, f), mode="r")

    def _writer(self, path: str, f: Any) -> Any:
        import pyarrow as pa

        return pa.PythonFile(_Writer(self, path, f), mode="w")


class _Reader:
    """A store's input file or stream (file-like, for ``pyarrow.PythonFile``): each read in
    :data:`CHUNK` pieces, each piece bounded. Seeking is local (no request)."""

    def __init__(self, owner: _Deadline, path: str, f: Any) -> None:
        self.owner, self.path, self.f = owner, path, f

    def read(self, n: int | None = -1) -> bytes:
        pieces: list[bytes] = []
        left = -1 if n is None or n < 0 else n
        while left:
            want = CHUNK if left < 0 else min(CHUNK, left)
            got = self.owner.run(f"reading {self.path}", lambda k=want: self.f.read(k))
            if not got:
                break
            pieces.append(got)
            if left > 0:
                left -= len(got)
        return b"".join(pieces)  # (one piece: the same object, not copied)

    def seek(self, pos: int, whence: int = 0) -> int:
        return int(self.f.seek(pos, whence))

    def tell(self) -> int:
        return int(self.f.tell())

    def size(self) -> int:
        return int(self.f.size())

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return bool(self.f.seekable())

    def writable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return bool(self.f.closed)

    def close(self) -> None:
        self.f.close()  # (a reader's close sends nothing)


class _Writer:
    """A store's output stream: each write in :data:`CHUNK` pieces, each piece bounded, and
    the close (where the upload completes) bounded."""

    def __init__(self, owner: _Deadline, path: str, f: Any) -> None:
        self.owner, self.path, self.f = owner, path, f

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for at in range(0, len(view), CHUNK):
            piece = view[at:at + CHUNK]
            self.owner.run(f"writing {self.path}", lambda p=piece: self.f.write(p))
        return len(view)

    def flush(self) -> None:
        self.owner.run(f"writing {self.path}", self.f.flush)

    def tell(self) -> int:
        return int(self.f.tell())

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return bool(self.f.closed)

    def close(self) -> None:
        if not self.f.closed:
            self.owner.run(f"completing {self.path}", self.f.close)
