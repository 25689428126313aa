"""Open a run directory read-only: one DuckDB view per table over all ranks and parts.

The views are built from explicit file lists rather than globs so that we decide, per file,
what is data (docs/FORMAT.md): only ``part-*.parquet``; a single part covered by a merged
``part-<a>-<b>`` is skipped (a kill between the merge's rename and its deletes leaves both);
a file whose Parquet footer cannot be read (torn write, foreign file) is skipped and named in
``Run.skipped_parts`` so the ``dropped_data`` detector can report it. Nothing is ever written
into the run directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from tracealyze.format.metaschema import RANK_FIELDS, RUN_FIELDS, check_meta
from tracealyze.format.parts import (
    RANK_FILE_RE,
    SNAPSHOT_DIR,
    SNAPSHOT_RE,
    is_real_dir,
    is_regular,
    rank_of,
)
from tracealyze.format.runmeta import MetaError, load_json
from tracealyze.format.storage import is_url

from ..errors import RunDirError, SchemaVersionError
from ..sql.safe import lock
from ..sql.schema import SCHEMA_VERSION, TABLE_NAMES
from . import inplace
from .footers import validate
from .handle import Run
from .held import (
    CHUNK_PARTS,
    HOLD_PARTS,
    Prefetch,
    held_name,
)
from .live import RELISTS, RetryingConnection, built_despite_merges
from .remote import mirror
from .view_sql import view_sql as _view_sql
from .views import build_views, new_connection


def _read_json(path: Path, fields: dict[str, tuple[type, ...]] = RUN_FIELDS,
               problems: list[str] | None = None) -> dict[str, Any]:
    """A metadata file checked against its schema (format.metaschema): a field of the wrong
    type is left out and named in ``problems``."""
    try:
        meta, bad = check_meta(load_json(path), fields)
    except MetaError as e:
        raise RunDirError(str(e)) from None
    if problems is not None:
        problems += [f"{path.name}: {b}" for b in bad]
    return meta


# ---------------------------------------------------------------------- discovery


def open_run(path: str | Path, *, allow_empty: bool = False, allow_files: bool = False,
             tables: set[str] | None = None) -> Run:
    """Open ``path`` read-only and build the views. Raises RunDirError / SchemaVersionError.

    ``allow_empty``: accept a run with no readable data part at all (by default it is an
    error: there is nothing to analyse). ``path`` may be a URL (``s3://``, ``gs://``,
    ``az://``, ``file://``): the run is read through a local mirror (:mod:`.remote`). The
    connection reads only files under ``path``
    unless ``allow_files`` (``query --allow-files``): sqlsafe.sandbox. ``tables``: a URL's
    mirror fetches only these tables' files (the others read as empty: ``query``).
    """
    url = str(path) if is_url(str(path)) else None
    if url is not None:  # a run in object storage: read through its local mirror
        path = mirror(url, tables=tables)
        allow_empty = allow_empty or tables is not None
    run, con = _scan_and_connect(path, allow_empty, allow_files)
    run.url = url

    def reopen() -> Any:  # a part merged away under a query (live.RetryingConnection)
        if url is not None:
            inplace.relist(run.run_dir)
        fresh, fresh_con = _scan_and_connect(run.run_dir, True, allow_files)
        for name in ("meta", "rank_meta", "skipped_parts", "files", "raw_traces", "snapshots",
                     "ranks"):
            setattr(run, name, getattr(fresh, name))
        return fresh_con

    run.con = RetryingConnection(con, reopen)
    return run


def _scan_and_connect(path: str | Path, allow_empty: bool, allow_files: bool
                      ) -> tuple[Run, Any]:
    """scan_run and a connection with the views (live.built_despite_merges)."""

    def build() -> tuple[Run, Any]:
        pre = Prefetch(lambda: new_connection([Path(path).resolve()],
                                              allow_files=allow_files))

        class Reads:  # scan_run's PartSink: each checked chunk of an uncompacted table read
            def chunk(self, run: Run, table: str, good: list[tuple[Path, Any]]) -> None:
                pre.chunk(held_name(table), _view_sql(table, good),
                          sum(run.part_rows.get(p, 0) for p, _ in good))

            def listed(self, table: str, good: list[tuple[Path, Any]]) -> None:
                pre.listed(held_name(table), len(good))

            def discard(self, table: str) -> None:
                pre.discard(held_name(table))

        con = None
        try:
            run, valid = scan_run(path, allow_empty=allow_empty, sink=Reads())
            prefetched = pre.done()
            con = pre.con or new_connection([run.run_dir], allow_files=allow_files)
            build_views(con, run, valid, prefetched=prefetched)
            lock(con)
        except BaseException:
            pre.cancel()
            if con is None:
                con = pre.con  # (made for the first held table, or None)
            if con is not None:
                con.close()
            raise
        return run, con

    return built_despite_merges(build)


class PartSink(Protocol):
    """Who reads an uncompacted table's parts while scan_run is still checking them."""

    def chunk(self, run: Run, table: str, good: list[tuple[Path, Any]]) -> None:
        """Some of ``table``'s parts, checked (a table of more than HOLD_PARTS parts)."""

    def listed(self, table: str, good: list[tuple[Path, Any]]) -> None:
        """Every readable part of ``table`` is known: ``good``."""

    def discard(self, table: str) -> None:
        """The chunks given so far are void: ``table`` is listed again."""


def scan_run(path: str | Path, *, allow_empty: bool = False, sink: PartSink | None = None
             ) -> tuple[Run, dict[str, list[tuple[Path, Any]]]]:
    """Read ``path``'s metadata and list its readable parts (no connection yet). ``sink``
    is given each checked chunk (CHUNK_PARTS) of a table of more than HOLD_PARTS parts, as
    soon as it is checked, and then the table's whole list."""
    run_dir = Path(path)
    try:  # DuckDB takes paths as UTF-8 text: a name that is not cannot be read
        str(run_dir.resolve()).encode("utf-8")
    except UnicodeEncodeError:
        raise RunDirError(f"the run directory's path is not valid UTF-8: "
                          f"{str(run_dir).encode('utf-8', 'backslashreplace').decode()}; "
                          "rename it to read the run") from None
    if not run_dir.exists():
        raise RunDirError(f"no such directory: {run_dir}")
    if not run_dir.is_dir():
        raise RunDirError(f"not a directory: {run_dir}")
    meta_path = run_dir / "run.json"
    if not is_regular(meta_path):
        raise RunDirError(f"not a run directory (no run.json): {run_dir}")
    problems: list[str] = []
    meta = _read_json(meta_path, RUN_FIELDS, problems)
    version = meta.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise RunDirError(f"{meta_path} has no integer schema_version")
    if version < 1:
        raise RunDirError(f"{meta_path} has an invalid schema_version {version}")
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"run format schema_version {version} is newer than this analyzer understands "
            f"({SCHEMA_VERSION}); upgrade tracealyze")

    run = Run(run_dir.resolve(), meta)
    run.meta_problems = problems
    ranks_dir = run_dir / "ranks"
    if is_real_dir(ranks_dir):
        for f in sorted(ranks_dir.iterdir()):
            r = rank_of(f.name, RANK_FILE_RE)
            if r is None or not is_regular(f):
                continue
            try:
                run.rank_meta[r] = _read_json(f, RANK_FIELDS, problems)
            except RunDirError as e:  # one torn rank file must not hide the run
                run.skipped_parts.append((f, str(e)))

    ranks: set[int] = set(run.rank_meta)
    valid: dict[str, list[tuple[Path, Any]]] = {}
    for table in TABLE_NAMES:
        for attempt in range(RELISTS):
            # Only regular files in real rank folders: a link could pull another run's data.
            per_rank = inplace.table_parts(run_dir, table, fresh=attempt > 0)
            files = [f for r in sorted(per_rank) for f in per_rank[r]]
            skipped: list[tuple[Path, str]] = []
            streamed = sink is not None and table != "trace_events" and len(files) > HOLD_PARTS
            size = CHUNK_PARTS if streamed else max(1, len(files))
            good: list[tuple[Path, Any]] | None = []
            for i in range(0, len(files), size):
                # (the last listing takes what still reads: a writer merging without pause)
                checked = validate(files[i:i + size], skipped, table, run.part_rows,
                                   relist=attempt < RELISTS - 1)
                if checked is None:
                    good = None
                    break
                good.extend(checked)
                if streamed and checked:
                    sink.chunk(run, table, checked)
            if good is not None:
                break
            if streamed:
                sink.discard(table)
        assert good is not None  # (the last attempt never asks to list again)
        ranks.update(per_rank)
        valid[table] = good
        run.skipped_parts.extend(skipped)
        run.files[table] = [p for p, _ in valid[table]]
        if sink is not None and table != "trace_events":
            sink.listed(table, good)
    traces_dir = run_dir / "traces"
    if is_real_dir(traces_dir):
        for entry in sorted(os.scandir(traces_dir), key=lambda e: e.name):
            r = rank_of(entry.name)
            if r is None or not entry.is_dir(follow_symlinks=False):
                continue
            for f in sorted(Path(entry.path).iterdir()):
                if is_regular(f) and (f.name.endswith(".json") or f.name.endswith(".json.gz")):
                    run.raw_traces.append((r, f))
                    ranks.add(r)
    run.snapshots = _snapshots(run_dir)
    run.ranks = sorted(ranks)

    if (not allow_empty and not any(valid.values()) and not run.raw_traces
            and run.status != "running"):
        # (A running or killed run without data yet is opened: the summary says which.)
        detail = f"; {len(run.skipped_parts)} unreadable part(s)" if run.skipped_parts else ""
        raise RunDirError(f"run has no recorded data (no readable part-*.parquet){detail}: "
                          f"{run_dir}")
    return run, valid


def _snapshots(run_dir: Path) -> list[tuple[int, Path]]:
    """``memory_snapshots/rank=<r>/oom-step<N>.pickle``: regular files only (no link is
    followed), by the recorder's own names; anything else there is ignored."""
    out: list[tuple[int, Path]] = []
    folder = run_dir / SNAPSHOT_DIR
    if not is_real_dir(folder):
        return out
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        r = rank_of(entry.name)
        if r is None or not entry.is_dir(follow_symlinks=False):
            continue
        for f in sorted(Path(entry.path).iterdir()):
            if SNAPSHOT_RE.match(f.name) and is_regular(f):
                out.append((r, f))
    return out
