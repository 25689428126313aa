"""``summary --watch`` and ``report --watch``: a live run followed from its files.

Still offline and file-based: every ``interval_s`` the run is opened afresh (what the
recorder flushed since), analysed, and the new findings said (``summary``) or the report
rewritten in place (``report``, atomically; the page says it is live and reloads itself).
Both stop when the run is no longer in progress (completed, crashed, or killed: its
heartbeat went stale), after one last pass; ``summary --watch --fail-on SEV`` stops at the
first finding that reaches ``SEV``.

Every wait has a bound. A local run directory is known by its identity (device, inode) from
the first look that finds it; when it is removed, or replaced (by a link, a file or another
directory), the watch ends with one line (RunDirError) instead of waiting forever for a run
that will never write there again. Before the run starts, the folder it is to be made in is
watched the same way. (Waiting for a run that has not started is a feature: only where it
could still start is checked.)
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..diagnosis.analysis import Analysis
from ..diagnosis.summary import reaches, summary_of
from ..errors import RunDirError
from ..run.catalog import open_run

Echo = Callable[[str], None]


def _snapshot(run_dir: Path | str, overrides: Any, config_file: Any
              ) -> tuple[dict[str, Any], bool] | None:
    """(summary, in progress) of the run now; None while it has no run.json yet."""
    from tracealyze.format.storage import is_url

    if not is_url(str(run_dir)) and not (Path(run_dir) / "run.json").exists():
        return None  # (its folder may not exist yet either)
    with open_run(run_dir, allow_empty=True) as run:
        summary = summary_of(Analysis(run, overrides, config_file=config_file))
    # In progress by the summary's own reading of the run ("killed" when a heartbeat is
    # stale): a second read of the liveness could see ranks that ended after the summary
    # was made, and the watch would end on a summary that still says "running".
    return summary, summary["run"]["status"] == "running"


class _Folder:
    """The run directory a watch follows (a local one), known by its identity from the first
    look that finds it; before that, the folder it is to be made in. A path given through a
    link is known by the link and by the directory it leads to: re-pointing it is a
    replacement too."""

    def __init__(self, run_dir: Path | str) -> None:
        """RunDirError unless the run's folder, or the folder it will be made in, exists (a
        watcher may start before the training makes its run directory)."""
        from tracealyze.format.storage import is_url

        self.run_dir = run_dir
        self.local = not is_url(str(run_dir))
        self.path = Path(run_dir).absolute()
        self.ident: tuple[int, ...] | None = None
        self.parent_ident: tuple[int, ...] | None = None
        if self.local:
            if _lstat(self.path) is None and not self.path.parent.is_dir():
                raise RunDirError(f"no such directory: {run_dir}")
            self.look()

    def look(self) -> None:
        """RunDirError when the run directory was removed or replaced since the last look
        (or, while it does not exist yet, the folder it is to be made in)."""
        if not self.local:
            return  # (a URL: each look lists the store, which says when the run is gone)
        now = _identity(self.path)
        if self.ident is None:
            if now is None:
                self._look_at_parent()
            elif not stat.S_ISDIR(now[-1]):
                raise RunDirError(f"not a directory: {self.run_dir}")
            else:
                self.ident = now[:-1]
        elif now is None:
            raise RunDirError(f"the run directory {self.run_dir} was removed while watching")
        elif now[:-1] != self.ident or not stat.S_ISDIR(now[-1]):
            raise RunDirError(f"the run directory {self.run_dir} was replaced while watching "
                              f"(now {_what(self.path, self.ident)})")

    def _look_at_parent(self) -> None:
        parent = self.path.parent
        now = _identity(parent)
        where = f"the folder {parent}, where the run directory is to be made,"
        if now is None:
            raise RunDirError(f"{where} was removed while waiting for the run to start")
        if self.parent_ident is None:
            self.parent_ident = now[:-1]
        elif now[:-1] != self.parent_ident or not stat.S_ISDIR(now[-1]):
            raise RunDirError(f"{where} was replaced while waiting for the run to start "
                              f"(now {_what(parent, self.parent_ident)})")


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _identity(path: Path) -> tuple[int, ...] | None:
    """(device, inode) of ``path`` itself and of what it leads to, then the mode of the
    latter; None when it is not there (or is a link that leads nowhere)."""
    own = _lstat(path)
    if own is None:
        return None
    try:
        to = os.stat(path) if stat.S_ISLNK(own.st_mode) else own
    except (FileNotFoundError, NotADirectoryError):
        return None
    return own.st_dev, own.st_ino, to.st_dev, to.st_ino, to.st_mode


def _what(path: Path, was: tuple[int, ...]) -> str:
    """What is at ``path`` now, in words (``was``: its identity before)."""
    own = _lstat(path)
    if own is None:
        return "nothing"
    if stat.S_ISLNK(own.st_mode):
        was_link = was[:2] != was[2:]  # (given through a link, which was re-pointed)
        return "a link to another directory" if was_link and path.is_dir() else \
            "a symbolic link"
    if stat.S_ISDIR(own.st_mode):
        return "another directory"
    return "a file" if stat.S_ISREG(own.st_mode) else "not a directory"


def watch_summary(run_dir: Path | str, *, fail_on: str | None, interval_s: float,
                  say: Echo, note: Echo, overrides: Any = None, config_file: Any = None,
                  sleep: Callable[[float], None] = time.sleep) -> tuple[dict[str, Any], bool]:
    """Follow the run; ``say`` each new finding above info as it appears (``note`` the
    progress). Returns the last summary and whether ``fail_on`` was reached (it returns at
    once then)."""
    folder = _Folder(run_dir)
    seen: set[tuple[str, str | None]] = set()
    note(f"watching {run_dir} every {interval_s:g} s (Ctrl-C stops)")
    waiting = False
    while True:
        folder.look()
        snap = _snapshot(run_dir, overrides, config_file)
        if snap is None:
            if not waiting:
                note("waiting for the run to start (no run.json yet)")
                waiting = True
            sleep(interval_s)
            continue
        summary, alive = snap
        reached = False
        for f in summary["findings"]:
            key = (f["id"], f.get("subject"))
            if f["severity"] == "info" or key in seen:
                continue
            seen.add(key)
            where = ", ".join(x for x in (f.get("subject") and str(f["subject"]),
                                          f.get("first_step") is not None
                                          and f"from step {f['first_step']}") if x)
            say(f"{time.strftime('%H:%M:%S')}  {f['severity'].upper():8s} {f['id']}: "
                f"{f['title']}" + (f"  [{where}]" if where else ""))
            if fail_on and reaches(f, fail_on):
                reached = True
        if reached or not alive:
            if not alive:
                note(f"the run is no longer in progress ({summary['run']['status']})")
            return summary, reached
        sleep(interval_s)


def watch_report(run_dir: Path | str, out: Path | None, *, interval_s: float, note: Echo,
                 overrides: Any = None, sleep: Callable[[float], None] = time.sleep
                 ) -> Path | str:
    """Rewrite the report every ``interval_s`` while the run is in progress (a live page
    that reloads itself), then once more as a final page; returns where it is."""
    from .page import write_report

    folder = _Folder(run_dir)
    note(f"watching {run_dir} every {interval_s:g} s (Ctrl-C stops)")
    while True:
        folder.look()
        snap_alive = _alive(run_dir)
        if snap_alive is None:
            sleep(interval_s)
            continue
        try:
            path = write_report(run_dir, out, overrides=overrides, progress=False,
                                live_refresh_s=interval_s if snap_alive else None)
        except RunDirError:
            if not snap_alive:
                raise
            sleep(interval_s)  # running, nothing flushed yet: nothing to draw
            continue
        if not snap_alive:
            note(f"the run is no longer in progress: final report {path}")
            return path
        note(f"{time.strftime('%H:%M:%S')} updated {path}")
        sleep(interval_s)


def _alive(run_dir: Path | str) -> bool | None:
    from tracealyze.format.storage import is_url

    if not is_url(str(run_dir)) and not (Path(run_dir) / "run.json").exists():
        return None
    with open_run(run_dir, allow_empty=True) as run:
        return run.in_progress
