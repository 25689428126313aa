"""Background writer: buffers rows per table and writes crash-safe Parquet parts.

The training thread only ever calls :meth:`Writer.submit`, which never blocks: when the
bounded queue is full the item is dropped and counted (the counts are written as
``dropped_data`` events). Everything else — waiting for device copies, building Arrow
tables, compression, file I/O, fsync — happens on the writer thread.

Each flush writes ``<table>/rank=<r>/part-<seq>.parquet`` under a temporary name, fsyncs it
and renames it into place, so a killed process leaves only complete files. A failed write
(disk full, directory deleted or read-only) keeps the rows buffered and retries at the next
flush; the failure is counted and reported once, and training never sees it.
"""

from __future__ import annotations

import json
import os
import select
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from tracealyze.format.parts import (
    COMPACT_FANOUT,
    compact,
    is_regular,
    next_seq,
    part_name,
    rank_dir,
    write_parquet_atomic,
)

from ..capture import StepItem
from ..live.guard import Guard
from .buffers import TableBuffer
from .rows import StepRows
from .schema import TABLES

SELF_REPORTED = frozenset({"step_values", "run_dir_deleted"})
"""Keys of :attr:`Writer.dropped` whose losses are reported by an event of their own."""

_FLUSH_SLACK_S = 0.01  # a flush this close to due is done now, not after one more sleep


class _Wakeup:
    """Wakes the writer thread from submit(): a byte written to a pipe it waits on.

    ``os.write`` takes no Python lock, so it is safe where a threading.Event is not: in a
    SIGTERM handler that interrupted the training thread inside submit(). Without pipes and
    select on them (Windows), the writer falls back to waking every 50 ms.
    """

    def __init__(self) -> None:
        try:
            self._r, self._w = os.pipe()
            os.set_blocking(self._r, False)
            os.set_blocking(self._w, False)
            select.select([self._r], [], [], 0)
        except (OSError, ValueError, AttributeError):
            self._r = self._w = -1

    def set(self) -> None:
        if self._w >= 0:
            try:
                os.write(self._w, b"\0")
            except OSError:  # pipe full (already woken many times) or closed
                pass

    def wait(self, timeout: float) -> None:
        if self._r < 0:
            time.sleep(min(timeout, 0.05))
            return
        try:
            ready, _, _ = select.select([self._r], [], [], timeout)
            if ready:
                os.read(self._r, 4096)
        except (OSError, ValueError):
            time.sleep(min(timeout, 0.05))

    def close(self) -> None:
        for fd in (self._r, self._w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._r = self._w = -1


class Writer:
    """Owns the writer thread, the per-table buffers and the part files of one rank."""

    def __init__(
        self,
        run_dir: Path,
        rank: int,
        *,
        flush_interval_s: float,
        flush_rows: int,
        queue_size: int,
        max_buffered_rows: int,
        max_buffered_bytes: int = 128 << 20,
        on_flush: Callable[[], None] | None = None,
        compact_fanout: int = COMPACT_FANOUT,
        guard: Guard | None = None,
        steps: StepRows | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.flush_interval_s = flush_interval_s
        self.flush_rows = flush_rows
        self.max_buffered_rows = max_buffered_rows
        self.max_buffered_bytes = max_buffered_bytes
        self.compact_fanout = compact_fanout
        self.parts_written = 0
        self.lost_parts = 0  # parts written earlier that vanished with a deleted run dir
        self._meta_seen = False
        self._dir_ident = _dir_ident(run_dir)  # (device, inode): a new one = recreated
        self.on_flush = on_flush
        self.room: Callable[[], bool] | None = None  # False: the spool's uploads are stuck
        # A deque, not queue.Queue: append/popleft are atomic under the GIL, so submit() takes
        # no lock (a SIGTERM handler closing the recorder cannot deadlock on a queue mutex).
        self.queue: deque[Any] = deque()
        self.queue_size = queue_size
        # When to wake. Each wake-up costs CPU that a small machine takes from training:
        # the writer's Python runs cold after a training step (~0.4 ms a wake-up in a
        # 2-core VM, whatever it finds queued), and what it finds becomes rows in one
        # vectorised batch, so it should wake rarely. But items must not wait in numbers:
        # each holds a few small tensors, and many of them alive between the training
        # loop's big allocations pinned ~40 MB of allocator memory over 250 fast steps when
        # nothing but a 0.5 s timeout woke the writer. So: submit() wakes it once every
        # `wake_every` items (at most that many wait), and otherwise it sleeps until the
        # next flush is due (the flush interval is a promise: what a kill -9 can lose).
        self.wake_every = 64
        self._wake = _Wakeup()
        self._stopping = threading.Event()
        self.buffers = {name: TableBuffer(name) for name in TABLES}
        self.dropped: Counter[str] = Counter()  # what could not be recorded, by table
        self._reported_dropped: Counter[str] = Counter()
        self.guard = guard or Guard()  # the recorder's: one count of failures
        self.steps = steps or StepRows()  # how committed steps become rows
        self._seq = next_seq(run_dir, rank)
        self._last_flush = time.monotonic()
        try:
            # A one-time ~0.1 s of CPU (pyarrow.compute builds its function wrappers on
            # import; numpy.ma comes with pyarrow's take/sort). Done here, in the constructor
            # before training starts: on the writer thread these imports would hold the GIL
            # during the first training steps, at the first flush mid-training otherwise.
            import numpy.ma  # noqa: F401
            import pyarrow.compute
            import pyarrow.parquet  # noqa: F401  (imported by the first part write)

            # pyarrow's first conversion imports pandas when it is installed (its pandas
            # shim checks every input): ~0.4 s and ~58 MB of RSS. At the first flush that
            # is a step in the run's RSS which a short run's leak check sees as growth
            # (a false memory_leak); here it is part of the run's starting memory.
            pa.array([0.0])
        except Exception:
            pass
        self._thread = threading.Thread(target=self._run, name="tracealyze-writer", daemon=True)
        self._closed = False
        self.step_hint = 0  # latest step seen, for events raised here
        self._thread.start()

    # ------------------------------------------------------------------ training thread
    def submit(self, item: Callable[[Writer], None], table: str = "steps", *,
               wake: bool = False) -> bool:
        """Hand an item to the writer thread; never blocks. False (and counted) if dropped.
        ``wake``: start on it now (a one-off job, such as compressing a profiler trace,
        that should not wait for the next batch of steps)."""
        if self._closed:
            return False
        q = self.queue
        if len(q) >= self.queue_size:
            self.dropped[table] += 1
            return False
        q.append(item)
        if wake or len(q) == self.wake_every:
            self._wake.set()
        return True

    def close(self, timeout: float = 60.0,
              give_up: Callable[[], bool] | None = None) -> bool:
        """Drain the queue, flush everything and stop the thread (idempotent). Waits at most
        ``timeout`` s, and stops waiting once ``give_up()`` is true (a second Ctrl-C's grace
        period ran out). True when the thread finished."""
        if not self._closed:
            self._closed = True
            self._stopping.set()
            self._wake.set()
        end = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < end:
            if give_up is not None and give_up():
                return False
            self._thread.join(0.05)
        if self._thread.is_alive():
            return False
        self._wake.close()
        return True

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------------ writer thread
    def append(self, table: str, columns: dict[str, Any]) -> None:
        """Add rows (a dict of equal-length columns; missing columns are null, rank is
        filled in at flush) to a table."""
        self.buffers[table].append(columns, len(next(iter(columns.values()))))

    def event(self, kind: str, message: str, *, severity: str = "warning",
              subject: str | None = None, stack: str | None = None,
              step: int | None = None, **details: Any) -> None:
        """Record an event from the writer thread itself."""
        self.append("events", {
            "step": [self.step_hint if step is None else step], "time": [time.time()],
            "kind": [kind], "severity": [severity], "subject": [subject],
            "message": [message], "stack": [stack],
            "details": [json.dumps(details, default=str)],
        })

    @property
    def errors(self) -> int:
        return self.guard.errors

    def record_error(self, where: str, exc: BaseException) -> None:
        """A failure on the writer thread: counted and said once (the guard), kept as an
        event."""
        self.guard.failed(where, exc)
        self.error_event(where, exc)

    def error_event(self, where: str, exc: BaseException) -> None:
        """The ``recorder_error`` event of a failure already counted."""
        try:
            self.event("recorder_error", f"{where}: {type(exc).__name__}: {exc}",
                       severity="error", subject=where,
                       stack="".join(traceback.format_exception(exc)), count=self.errors)
        except Exception:
            pass

    def _run(self) -> None:
        while True:
            # Sleep until woken (wake_every items, a one-off job, close) or until the next
            # flush is due, whichever comes first.
            until_flush = self._last_flush + self.flush_interval_s - time.monotonic()
            self._wake.wait(max(0.0, until_flush))
            stopping = self._stopping.is_set()
            try:
                self._drain()
                due = (time.monotonic() - self._last_flush
                       >= self.flush_interval_s - _FLUSH_SLACK_S)
                if stopping or due or any(b.rows >= self.flush_rows
                                          for b in self.buffers.values()):
                    self.flush()
            except Exception as exc:  # the writer thread must outlive its own bugs
                self.record_error("writer", exc)
            if stopping:
                return

    def _drain(self) -> None:
        """Process everything queued. Consecutive committed steps (``StepItem``, plain
        data) are written as one batch by ``self.steps``; anything else is a job, called."""
        q = self.queue
        while q:
            batch = [q.popleft()]
            many = isinstance(batch[0], StepItem)
            if many:
                while q and isinstance(q[0], StepItem) and len(batch) < 512:
                    batch.append(q.popleft())
            try:
                if many:
                    self.steps.write(self, batch)
                else:
                    batch[0](self)
            except Exception as exc:  # a bad item must not kill the writer
                self.record_error("writer", exc)
            if any(b.rows >= self.flush_rows for b in self.buffers.values()):
                self.flush()
            # Let the training thread have the GIL between batches.
            time.sleep(0)

    def flush(self) -> None:
        """Write every non-empty buffer as a new part; keep rows whose write failed."""
        self._last_flush = time.monotonic()
        new_drops = self.dropped - self._reported_dropped
        # (losses with an event of their own: bad rec.step() values, a deleted run dir)
        new_drops = Counter({k: v for k, v in new_drops.items() if k not in SELF_REPORTED})
        if new_drops:
            self._reported_dropped.update(new_drops)
            self.event("dropped_data",
                       f"recorder dropped {sum(new_drops.values())} item(s) or row(s) (queue "
                       "full or writes failing): " + ", ".join(
                           f"{k} {v}" for k, v in sorted(new_drops.items())),
                       severity="warning", subject="writer_queue",
                       dropped=dict(new_drops), dropped_total=dict(self.dropped))
        ok = True
        self._check_run_dir()
        for buf in self.buffers.values():
            bad = buf.bad_rows
            try:
                table = buf.take()
            except Exception as exc:  # unconvertible rows: lose them, loudly
                self.dropped[buf.name] += buf.rows
                buf.rows = 0
                self.record_error(f"convert:{buf.name}", exc)
                continue
            if buf.bad_rows > bad:
                self.dropped[buf.name] += buf.bad_rows - bad
                self.record_error(f"convert:{buf.name}", ValueError(
                    f"{buf.bad_rows - bad} row(s) could not be converted; the others were kept"))
            if table is None:
                continue
            try:
                self._write_part(buf.name, table)
            except Exception as exc:
                ok = False
                buf.put_back(table)
                self.record_error(f"write:{buf.name}", exc)
        if not ok:
            self._bound_failed()
        if ok and self.on_flush is not None:
            try:
                self.on_flush()
            except Exception as exc:
                self.record_error("heartbeat", exc)
        self._check_run_dir()  # deleted during this flush (its event goes out with the next)

    def _bound_failed(self) -> None:
        """Writes keep failing (disk full, read-only, deleted): rows wait for the next try,
        but memory is bounded in bytes and rows; beyond that, the oldest batch of the table
        holding the most bytes is dropped, counted (per-tensor rows go first; every table
        keeps its newest rows)."""
        held = {b: sum(t.nbytes for t in b.failed) for b in self.buffers.values() if b.failed}
        rows = sum(b.rows for b in self.buffers.values())
        while held and (sum(held.values()) > self.max_buffered_bytes
                        or rows > self.max_buffered_rows):
            buf = max(held, key=held.__getitem__)
            oldest = buf.failed[0]
            self.dropped[buf.name] += buf.drop_oldest(buf.rows - oldest.num_rows)
            held[buf] -= oldest.nbytes
            rows -= oldest.num_rows
            held = {b: n for b, n in held.items() if b.failed}

    def _check_run_dir(self) -> None:
        """A run directory deleted under a running recorder is written anew (the rank's
        metadata and data from now on), but what it held is gone: say so once per loss.
        Checked before and after each flush. Deleted means: the directory is not the one
        seen last (another inode: our own writes may already have recreated it, mid-flush),
        or this rank's metadata vanished from it."""
        ident = _dir_ident(self.run_dir)
        # (from "missing" to a directory is our own writes recreating it: already reported)
        moved = self._dir_ident is not None and ident != self._dir_ident
        self._dir_ident = ident
        meta = is_regular(self.run_dir / "ranks" / f"rank={self.rank}.json")
        gone = moved or (self._meta_seen and not meta)
        self._meta_seen = meta
        if not gone or self.parts_written == self.lost_parts:
            return
        lost = self.parts_written - self.lost_parts
        self.lost_parts = self.parts_written
        self.dropped["run_dir_deleted"] += 1
        self.event("dropped_data", f"the run directory (or this rank's files) was deleted while "
                   f"recording: {lost} part file(s) written earlier are gone; recording goes "
                   "on in a new directory", severity="error", subject="run_dir",
                   lost_parts=lost, reason="run_dir_deleted")

    def _write_part(self, table_name: str, table: pa.Table) -> None:
        if self.room is not None and not self.room():  # (rows wait, then drop: counted)
            raise OSError("the uploads of the spool are behind by max_spool_bytes")
        d = rank_dir(self.run_dir, table_name, self.rank)
        d.mkdir(parents=True, exist_ok=True)  # also recreates a deleted run directory
        write_parquet_atomic(table, d / part_name(self._seq))
        self._seq += 1
        self.parts_written += 1
        if self.compact_fanout:
            try:
                # A killed run keeps O(fanout x log N) files, not one per flush: reading
                # 20,000 parts took the analyzer 26 s (merged: 1 s).
                compact(d, table_name, fanout=self.compact_fanout)
            except Exception as exc:  # data is safe in the parts; compaction can wait
                self.record_error(f"compact:{table_name}", exc)


def merge_parts(run_dir: Path, rank: int) -> int:
    """Merge each table's parts of this rank into one file (at close); files merged away."""
    return sum(compact(rank_dir(run_dir, t, rank), t, final=True) for t in TABLES
               if (run_dir / t).is_dir())


def _dir_ident(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
