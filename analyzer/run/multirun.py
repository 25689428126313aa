"""Several runs in one query: ``tracealyze query RUN_A RUN_B ... "SQL"``.

Each run's views are built in a schema of one DuckDB connection (``run0``, ``run1``, ...,
exactly as :func:`~.catalog.open_run` builds them for one run: sharded runs combined, raw
traces included), then every view name becomes one view over all of them with a leading
``run_id`` column (``UNION ALL BY NAME``: a column one run lacks is NULL for it). A sweep or
the nodes of a fleet line up in SQL::

    SELECT run_id, median(duration_s) FROM steps GROUP BY run_id ORDER BY 2
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tracealyze.format.storage import expand, is_url

from ..errors import RunDirError
from ..sql.safe import execute_one, literal, lock
from .catalog import scan_run
from .handle import Run, Views
from .live import RetryingConnection, built_despite_merges
from .remote import mirror
from .views import build_views, new_connection


class RunSet(Views):
    """Runs opened together; ``.query(sql)`` sees every view with a ``run_id`` column.
    Close with ``.close()`` or ``with``."""

    def __init__(self, runs: list[Run], run_ids: list[str], con: Any,
                 skipped: list[str] | None = None) -> None:
        self.runs, self.run_ids, self.con = runs, run_ids, con
        self.skipped = skipped or []
        """'PATH: why' for each directory given that is not a run (left out)."""


def _ids(runs: list[Run]) -> list[str]:
    """Each run's run_id; where two runs share one (a copied run directory), the folder name
    is added so that rows stay apart."""
    ids = [r.run_id or r.folder_name for r in runs]
    out = []
    for r, i in zip(runs, ids, strict=True):
        out.append(i if ids.count(i) == 1 else f"{i}@{r.folder_name}")
    for n, i in enumerate(out):  # still equal (same folder names in different places)
        if out.count(i) > 1:
            out[n] = f"{i}#{n}"
    return out


def open_runs(paths: Sequence[str | Path], *, allow_files: bool = False,
              also_read: Sequence[Path] = (), more_views: Callable[[Any], None] | None = None
              ) -> RunSet:
    """Open ``paths`` (two or more run directories) into one connection, which reads only
    files under them unless ``allow_files`` (sqlsafe.sandbox). RunDirError names the run
    that cannot be opened. ``also_read``: more directories the views may read (a fleet
    index), whose views ``more_views(con)`` adds before the connection is locked."""
    if not paths:
        raise RunDirError("no run directory given")
    try:  # s3://bucket/sweep/lr-*: every run the pattern names (a shell cannot glob a URL)
        paths = [u for p in paths for u in (expand(str(p)) if is_url(str(p)) else [p])]
    except (ValueError, OSError) as e:
        raise RunDirError(f"cannot list {' '.join(str(e).split())[:300]}") from None
    if not paths:
        raise RunDirError("the URL pattern names no run (no run.json under it)")
    # a run in object storage is read from its local mirror, and named by its URL
    url_of: dict[str, str] = {}
    for i, p in enumerate(paths):
        if is_url(str(p)):
            paths[i] = mirror(str(p))
            url_of[str(paths[i])] = str(p)
    # A glob over a sweep's folder catches the odd non-run directory (logs/, a checkpoint
    # folder): it is left out with a warning, not allowed to abort the query over the rest.
    not_runs = {p for p in paths if Path(p).is_dir() and not (Path(p) / "run.json").exists()}
    skipped = [f"{p}: not a run directory (no run.json)" for p in paths if p in not_runs]
    paths = [p for p in paths if p not in not_runs]
    if not paths:
        raise RunDirError("none of the directories given is a run (no run.json in any)")
    seen: dict[Path, str] = {}
    for p in paths:
        real = Path(p).resolve()
        if real in seen:
            raise RunDirError(f"the same run is given twice: {seen[real]} and {p}")
        seen[real] = str(p)
    labels = [url_of.get(str(p), str(p)) for p in paths]
    extra = (also_read, more_views)
    runs, ids, con = built_despite_merges(lambda: _build(paths, labels, seen, allow_files,
                                                         *extra))

    def reopen() -> Any:  # a part merged away under a query (live.RetryingConnection)
        fresh, _, fresh_con = built_despite_merges(
            lambda: _build(paths, labels, seen, allow_files, *extra))
        runs[:] = fresh
        return fresh_con

    return RunSet(runs, ids, RetryingConnection(con, reopen), skipped)


def _build(paths: Sequence[str | Path], labels: list[str], seen: dict[Path, str],
           allow_files: bool, also_read: Sequence[Path] = (),
           more_views: Callable[[Any], None] | None = None) -> tuple[list[Run], list[str], Any]:
    """Every run's views in a schema of one connection, and the union views over them
    (``run_path``: ``labels``, the path or URL each run was given as)."""
    con = new_connection([*seen, *also_read], allow_files=allow_files)
    runs: list[Run] = []
    try:
        for i, p in enumerate(paths):
            run, valid = scan_run(p)
            if is_url(labels[i]):  # (read from its mirror)
                run.url = labels[i]
            build_views(con, run, valid, schema=f"run{i}")
            runs.append(run)
        ids = _ids(runs)
        views: dict[str, list[int]] = {}
        for schema, name in con.execute(
                "SELECT schema_name, view_name FROM duckdb_views() WHERE NOT internal "
                "AND schema_name LIKE 'run%' ORDER BY view_name").fetchall():
            views.setdefault(name, []).append(int(schema[3:]))
        for name, members in views.items():
            union = " UNION ALL BY NAME ".join(
                f"SELECT {literal(ids[i])} AS run_id, {literal(labels[i])} AS run_path, "
                f"* FROM run{i}.{name}"
                for i in sorted(members))
            execute_one(con, f"CREATE VIEW main.{name} AS {union}")
        if more_views is not None:
            more_views(con)
        lock(con)
    except BaseException:
        con.close()
        raise
    return runs, ids, con
