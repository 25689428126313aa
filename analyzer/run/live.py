"""Reading a run that is still being written.

The recorder merges parts as it goes: the merged part is written first, then the parts it
covers are deleted. A reader that listed the parts before a merge may find one gone when it
opens it (9 of 60 analyzer calls on a live run failed so). Two answers, each for one moment:

* while listing (catalog.scan_run): a part that vanishes between the listing and its footer
  read means a merge happened; the table is listed again, up to :data:`RELISTS` times;
* while querying (:class:`RetryingConnection`): DuckDB opens a file only when a query scans
  it; a file gone by then fails the query with an IO error. The run is opened again (fresh
  listing, fresh views, a fresh connection swapped in) and the query run once more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

RELISTS = 5
"""Listings of one table before a still-moving part set is taken as it is. A merge renames
one file and deletes up to 16: a listing twice in a row inside that window is unlikely, five
times is a writer merging without pause."""

RETRIES = 3
"""Reopens of the run for one query (a merge per retry would take minutes of flushes)."""


def vanished(exc: BaseException) -> bool:
    """True when a DuckDB error says a file it was given is no longer there."""
    text = str(exc)
    return (type(exc).__name__ == "IOException" and (
        "No files found" in text or "No such file" in text or "does not exist" in text)
    ) or "FileNotFoundError: No such file" in text  # (a part read in place: inplace.py)


class RetryingConnection:
    """A DuckDB connection whose ``execute`` survives a part deleted under it: on such an
    error, ``reopen()`` gives a fresh connection over a fresh listing, and the statement runs
    again. Everything else is the wrapped connection's."""

    def __init__(self, con: Any, reopen: Callable[[], Any]) -> None:
        self._con = con
        self._reopen = reopen

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        for attempt in range(RETRIES + 1):
            try:
                return self._con.execute(*args, **kwargs)
            except Exception as e:
                if attempt == RETRIES or not vanished(e):
                    raise
                old, self._con = self._con, self._reopen()
                old.close()
        raise AssertionError("unreachable")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


def built_despite_merges(build: Callable[[], T]) -> T:
    """``build()`` (list a run's parts and make its views), again when it failed because a
    part was merged away meanwhile (DuckDB reads each file's schema as a view is made:
    RunDirError caused by a vanished file); up to :data:`RETRIES` times."""
    from ..errors import RunDirError

    for attempt in range(RETRIES + 1):
        try:
            return build()
        except RunDirError as e:
            if attempt == RETRIES or e.__cause__ is None or not vanished(e.__cause__):
                raise
    raise AssertionError("unreachable")
