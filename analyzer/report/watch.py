"""``summary --watch`` and ``report --watch``: a live run followed from its files.

Still offline and file-based: every ``interval_s`` the run is opened afresh (what the
recorder flushed since), analysed, and the new findings said (``summary``) or the report
rewritten in place (``report``, atomically; the page says it is live and reloads itself).
Both stop when the run is no longer in progress (completed, crashed, or killed: its
heartbeat went stale), after one last pass; ``summary --watch --fail-on SEV`` stops at the
first finding that reaches ``SEV``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..diagnosis.analysis import Analysis
from ..diagnosis.findings import severity_rank
from ..diagnosis.summary import summary_of
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


def _first_wait(run_dir: Path | str) -> None:
    """RunDirError unless the run's folder, or the folder it will be made in, exists (a
    watcher may start before the training makes its run directory)."""
    from tracealyze.format.storage import is_url

    if not is_url(str(run_dir)) and not Path(run_dir).is_dir() \
            and not Path(run_dir).absolute().parent.is_dir():
        raise RunDirError(f"no such directory: {run_dir}")


def watch_summary(run_dir: Path | str, *, fail_on: str | None, interval_s: float,
                  say: Echo, note: Echo, overrides: Any = None, config_file: Any = None,
                  sleep: Callable[[float], None] = time.sleep) -> tuple[dict[str, Any], bool]:
    """Follow the run; ``say`` each new finding above info as it appears (``note`` the
    progress). Returns the last summary and whether ``fail_on`` was reached (it returns at
    once then)."""
    _first_wait(run_dir)
    seen: set[tuple[str, str | None]] = set()
    note(f"watching {run_dir} every {interval_s:g} s (Ctrl-C stops)")
    waiting = False
    while True:
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
            if fail_on and severity_rank(f["severity"]) >= severity_rank(fail_on):
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

    _first_wait(run_dir)
    note(f"watching {run_dir} every {interval_s:g} s (Ctrl-C stops)")
    while True:
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
