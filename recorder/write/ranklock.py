"""One writer per rank folder (docs/FORMAT.md, "Writers").

Two recorders writing one rank interleave their parts, renumber each other's merges and
overwrite each other's run.json: rows vanish without a word. So a recorder holds an OS lock
(``flock`` on ``ranks/rank=<r>.lock``) for as long as it writes; the kernel releases it when
the process dies, so ``kill -9`` never leaves a rank locked. A lock that a shared file system
does not share between hosts is backed by the heartbeat: a rank whose file says ``running``
with a heartbeat that still moves has a live writer somewhere.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from tracealyze.format.runmeta import as_float, read_json, stale_after_s

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: the heartbeat check alone
    fcntl = None  # type: ignore[assignment]


def _holder(info: dict[str, Any] | None) -> str:
    info = info or {}
    return (f"pid {info.get('pid', '?')} on host {info.get('host', '?')}"
            + (f" (since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(s))})"
               if (s := as_float(info.get("started"))) else ""))


def _pid_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError, OverflowError):
        return False
    except PermissionError:  # exists, someone else's
        return True
    return True


class RankLock:
    """The lock of one rank folder. :meth:`acquire` raises ``ValueError`` naming the live
    writer; :meth:`release` is idempotent."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.path = run_dir / "ranks" / f"rank={rank}.lock"
        self.rank_file = run_dir / "ranks" / f"rank={rank}.json"
        self.rank = rank
        self._fd = -1

    def acquire(self, *, flush_interval_s: Any = None) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = self._locked_fd()
        try:
            self._check_heartbeat(flush_interval_s)
        except ValueError:
            os.close(fd)
            raise
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(me).encode(), 0)
        except OSError:
            pass  # the lock holds without its note
        self._fd = fd

    def _locked_fd(self) -> int:
        """An open descriptor of the lock file, flocked. The file is removed at release, so
        a lock taken on a file that was unlinked meanwhile is taken again on the new one."""
        for _ in range(10):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0),
                         0o644)
            if fcntl is None:
                return fd
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise ValueError(self._refusal(read_json(self.path))) from None
            try:
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)  # released and removed under us: lock the file now there
        raise ValueError(f"cannot lock {str(self.path)!r}: it keeps being replaced")

    def _check_heartbeat(self, flush_interval_s: Any) -> None:
        """Refuse a rank whose file shows a live writer the lock did not see (another host
        on a file system without shared locks, or a writer of an older version). On this
        host, a dead pid is not live. Elsewhere, wait while the heartbeat is fresh: it
        either moves (a live writer: refused) or goes stale (killed: taken over)."""
        info = read_json(self.rank_file)
        if not info or info.get("status") != "running":
            return
        beat = as_float(info.get("heartbeat"))
        if beat is None:
            return
        if info.get("host") == socket.gethostname():
            if info.get("pid") != os.getpid() and _pid_alive(info.get("pid")) \
                    and time.time() - beat < stale_after_s(flush_interval_s):
                raise ValueError(self._refusal(info))
            return
        limit = stale_after_s(info.get("flush_interval_s") or flush_interval_s)
        if time.time() - beat >= limit:
            return
        print(f"tracealyze: rank {self.rank} was written by {_holder(info)} "
              f"{time.time() - beat:.0f} s ago; waiting up to {limit:.0f} s to see whether "
              "it is still alive", file=sys.stderr, flush=True)
        while time.time() - beat < limit:
            time.sleep(min(1.0, max(0.05, limit - (time.time() - beat))))
            now_info = read_json(self.rank_file) or {}
            if now_info.get("status") != "running":
                return
            if as_float(now_info.get("heartbeat")) != beat:
                raise ValueError(self._refusal(now_info))

    def _refusal(self, info: dict[str, Any] | None) -> str:
        return (f"rank {self.rank} of run_dir {str(self.path.parent.parent)!r} is being "
                f"written by {_holder(info)}; a rank has one writer: wait for it to end, or "
                "choose another run_dir")

    def release(self, *, remove: bool = True) -> None:
        """Give the rank up: the lock file is removed (while still locked, so whoever
        locks it next finds it gone and takes the new one) and the descriptor closed.
        ``remove=False``: only this process's descriptor (a forked child's copy)."""
        if self._fd >= 0:
            if remove:
                try:
                    self.path.unlink()
                except OSError:
                    pass
            try:
                os.close(self._fd)  # closing the descriptor releases the flock
            except OSError:
                pass
            self._fd = -1

