"""Recording to object storage: the run is written to a local spool exactly as a local run
(atomic part files, run.json, compaction), and an uploader thread keeps the store's copy in
step with it.

Commit point on the store (docs/FORMAT.md, "Object storage"): an object is visible under
its final name only once its upload completed (one PUT or a completed multipart upload);
there is no rename. Each sync uploads what changed in the spool in this order: parts, raw
traces, rank files, and run.json last, so a reader that finds run.json saying ``completed``
finds every part. A part that compaction merged away in the spool is deleted from the store
only after the merged part that covers it was uploaded (readers skip covered parts, so a
store holding both reads right).

The uploader never blocks training or the writer: it runs on its own thread, woken after
each flush, and a store that is down is retried with backoff (doubling to a minute); when
it answers again, a ``storage_delayed`` event says for how long it did not. What a node
loses when it dies is what was not uploaded yet: at most one flush interval plus the upload
time. After ``kill -9`` the spool is uploaded by ``Recorder(url, resume=True)`` on the same
node or by ``tracealyze upload SPOOL``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .storage import (
    Location,
    delete,
    fetch,
    has_run,
    is_url,
    list_run,
    local_files,
    locate,
    run_file,
    write_bytes,
)

SPOOL_NOTE = ".tracealyze-spool.json"
"""In each spool: the URL it uploads to (for ``tracealyze upload SPOOL``)."""
_ORDER = {"part": 0, "trace": 1, "snapshot": 1, "rank_meta": 2, "meta": 3}


def spool_for(url: str, spool_dir: str | None) -> Path:
    """The spool of ``url``: one folder per URL under ``spool_dir`` (default: the system
    temporary directory), the same on every start, so that a resume finds it."""
    base = Path(spool_dir) if spool_dir else Path(tempfile.gettempdir()) / "tracealyze-spool"
    return base / hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:24]


def open_store(url: str, resume: bool, spool: Path) -> Location:
    """Check ``url`` at construction (ValueError, one line: a bad URL, a bucket that does
    not exist, credentials refused, a run already there when not resuming) and prepare the
    spool: a resume on a node without the spool brings the run's files back into it."""
    try:
        loc = locate(url)
        stored = list_run(loc)
    except (ValueError, OSError) as e:
        raise ValueError(f"cannot record to {url}: {' '.join(str(e).split())[:300]}") from None
    if has_run(stored) and not resume and not (spool / "run.json").exists():
        raise ValueError(f"{url} already holds a run; pass resume=True to continue it, or "
                         "choose another URL")
    spool.mkdir(parents=True, exist_ok=True)
    (spool / SPOOL_NOTE).write_text(json.dumps({"url": loc.url}))
    if resume and not (spool / "run.json").exists():
        for f in stored:  # (a new node: the run so far, to continue its numbering)
            fetch(loc, f, spool)
    return loc


class Uploader:
    """Keeps ``loc`` in step with the ``spool`` folder, on a background thread."""

    def __init__(self, spool: Path, loc: Location, *,
                 on_event: Callable[[str, str, str, dict[str, Any]], None] | None = None,
                 interval_s: float = 5.0, rank: int | None = None,
                 uploaded: dict[str, tuple[int, int]] | None = None) -> None:
        """``rank``: upload only that rank's files (and run.json from rank 0): the ranks of
        a node share one spool, each uploading its own. None: everything (``upload``).
        ``uploaded``: what the store already holds (``rel -> (size, mtime_ns)`` of the
        spool's copy); set before the thread starts, whose first sync runs at once."""
        self.spool, self.loc, self.rank = spool, loc, rank
        self.on_event = on_event
        self.interval_s = interval_s
        self.uploaded: dict[str, tuple[int, int]] = dict(uploaded or {})
        self.bytes_uploaded = 0
        self.failures = 0
        self._down_since: float | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one sync at a time (the thread, close)
        self._thread = threading.Thread(target=self._run, name="tracealyze-upload",
                                        daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Something was written to the spool (a flush): sync soon."""
        self._wake.set()

    def sync(self) -> None:
        """Upload what changed since the last sync, then delete what was merged away.
        Raises the store's error (the caller retries)."""
        with self._lock:
            now = {rel: st for rel, st in local_files(self.spool).items() if self.mine(rel)}
            todo = sorted((rel for rel, st in now.items() if self.uploaded.get(rel) != st),
                          key=lambda rel: (_ORDER[run_file(rel) or "meta"], rel))
            for rel in todo:
                try:
                    data = (self.spool / rel).read_bytes()
                except FileNotFoundError:  # merged away since the listing: next time
                    continue
                write_bytes(self.loc, rel, data)
                self.uploaded[rel] = now[rel]
                self.bytes_uploaded += len(data)
            for rel in [r for r in self.uploaded if r not in now and run_file(r) == "part"]:
                delete(self.loc, rel)
                del self.uploaded[rel]

    def backlog_bytes(self) -> int:
        """Bytes of this rank's files in the spool not uploaded in their current state."""
        done = dict(self.uploaded)
        return sum(st[0] for rel, st in local_files(self.spool).items()
                   if self.mine(rel) and done.get(rel) != st)

    def mine(self, rel: str) -> bool:
        """Whether ``rel`` is this uploader's to send (its rank's, or everything)."""
        if self.rank is None:
            return True
        if rel == "run.json":
            return self.rank == 0
        return f"rank={self.rank}/" in rel + "/" or rel == f"ranks/rank={self.rank}.json"

    def _run(self) -> None:
        # At once, not one interval later: run.json and the rank files reach the store as
        # training starts, so a node lost before its first flush leaves a run the analyzer
        # lists (and calls killed), not nothing.
        backoff = 1.0 if self._attempt() else 2.0
        while not self._stop.is_set():
            self._wake.wait(self.interval_s if self._down_since is None else backoff)
            self._wake.clear()
            if self._stop.is_set():
                return
            backoff = 1.0 if self._attempt() else min(60.0, backoff * 2)

    def _attempt(self) -> bool:
        started = time.monotonic()
        try:
            self.sync()
        except Exception as e:  # the store is down or refusing: retried, never raised
            self.failures += 1
            if self._down_since is None:
                self._down_since = started
                self._event("storage_unavailable", f"uploads to {self.loc.url} failed "
                            f"({type(e).__name__}: {' '.join(str(e).split())[:200]}); "
                            "retrying, the run is kept in the local spool", "warning",
                            {"spool": str(self.spool)})
            return False
        # How long what was flushed waited for the store: beyond the flush interval (and
        # 2 s of ordinary upload time), what a lost node would lose grew past what
        # flush_interval_s promises: said once the store answers again.
        held = time.monotonic() - (self._down_since if self._down_since is not None
                                   else started)
        self._down_since = None
        if held > max(2.0, self.interval_s):
            self._event("storage_delayed", f"uploads to {self.loc.url} were held up "
                        f"{held:.1f} s (the store was slow or unreachable); the run was "
                        "kept in the local spool meanwhile", "info", {"delay_s": held})
        return True

    def _event(self, kind: str, message: str, severity: str, details: dict[str, Any]) -> None:
        if self.on_event is not None:
            try:
                self.on_event(kind, message, severity, details)
            except Exception:
                pass

    def settle(self, timeout_s: float = 60.0) -> None:
        """Stop the thread; when the store was down, try it once more now, so that the
        ``storage_delayed`` event (how long uploads were held up) is said while the run's
        writer still takes events. Called before the writer's last flush: an event the
        thread raised after it would be lost (the outage never reported)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=timeout_s)
        if self._down_since is not None and not self._thread.is_alive():
            self._attempt()

    def close(self, timeout_s: float = 60.0) -> bool:
        """Stop the thread and upload the rest, retrying until ``timeout_s``. False when the
        store could not be brought up to date (the spool is kept and named on stderr)."""
        deadline = time.monotonic() + timeout_s  # (the thread's own sync included)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=timeout_s)
        delay = 0.5
        while True:
            try:
                self.sync()
                return True
            except Exception as e:
                if time.monotonic() + delay > deadline:
                    print(f"tracealyze: could not upload the run to {self.loc.url} "
                          f"({type(e).__name__}); it is kept in {self.spool}: upload it with "
                          f"`tracealyze upload {self.spool}`", file=sys.stderr)
                    return False
                time.sleep(delay)
                delay = min(delay * 2, 10.0)


def upload_spool(spool: Path, timeout_s: float = 600.0) -> tuple[str, int]:
    """Upload a spool left by a killed run (``tracealyze upload``): (URL, bytes sent).
    ValueError when ``spool`` is not one; OSError when the store refuses until timeout."""
    try:
        url = json.loads((spool / SPOOL_NOTE).read_text())["url"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"not a tracealyze spool (no {SPOOL_NOTE}): {spool}") from None
    loc = locate(str(url))
    up = Uploader(spool, loc, interval_s=3600.0)
    if not up.close(timeout_s):
        raise OSError(f"could not upload {spool} to {url}")
    return loc.url, up.bytes_uploaded


def remove_spool(spool: Path) -> None:
    """A spool whose run is fully uploaded and closed is deleted."""
    import shutil

    shutil.rmtree(spool, ignore_errors=True)


class Spool:
    """A Recorder's run in object storage: the local spool it writes, and its uploader."""

    def __init__(self, url: str, spool_dir: str | None, resume: bool) -> None:
        """ValueError (at the Recorder's construction) when ``url`` cannot be recorded to."""
        self.url = url.rstrip("/")
        self.path = spool_for(self.url, spool_dir)
        self.loc = open_store(self.url, resume, self.path)
        self.uploader: Uploader | None = None

    @classmethod
    def of(cls, run_dir: Any, spool_dir: str | None, resume: bool) -> Spool | None:
        """The spool of a URL ``run_dir``; None for a local path."""
        return cls(str(run_dir), spool_dir, resume) if is_url(str(run_dir)) else None

    def start(self, event: Callable[..., None], config: Any, rank: int, writer: Any) -> None:
        """Start uploading ``rank``'s files after each of ``writer``'s flushes, and hold the
        writer's new parts back while the uploads are behind by ``config.max_spool_bytes``;
        ``event`` is the Recorder's (``event(kind, message, severity=..., **details)``)."""
        self.uploader = Uploader(
            self.path, self.loc, interval_s=config.flush_interval_s, rank=rank,
            on_event=lambda kind, msg, sev, details: event(kind, msg, severity=sev, **details))
        writer.room = lambda: self.room(config.max_spool_bytes)

    def wake(self) -> None:
        if self.uploader is not None:
            self.uploader.wake()

    def settle(self, timeout_s: float = 60.0) -> None:
        """Before the writer's last flush: :meth:`Uploader.settle`."""
        if self.uploader is not None:
            self.uploader.settle(timeout_s)

    def room(self, max_bytes: int) -> bool:
        """Whether the writer may add a part: the uploads are behind by less than
        ``max_bytes`` (a store down for long must not fill the node's disk)."""
        return self.uploader is None or self.uploader.backlog_bytes() < max_bytes

    def close(self, timeout_s: float = 60.0) -> None:
        """The final upload; this rank's files leave the spool once the store has them all
        (the spool itself once no rank's files are left)."""
        up = self.uploader
        if up is None or not up.close(timeout_s):
            return
        for rel in [r for r in local_files(self.path) if up.mine(r)]:
            (self.path / rel).unlink(missing_ok=True)
        if not local_files(self.path):
            remove_spool(self.path)
