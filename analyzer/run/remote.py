"""A run directory in object storage (``s3://``, ``gs://``, ``az://``, ``file://``), read
through a local mirror.

Every command opens a URL by listing the store once and bringing the run's small files
(format.storage.run_file: run.json, the rank files, raw traces; nothing else under the
prefix) into a cache folder, one per URL; its parts are read in place (:mod:`.inplace`:
the footers and the column chunks a query needs, in ranged reads kept in the same folder).
The folder is then read exactly as a local run: the same checks, views and sandbox. A file
is fetched again only when its size or modification time changed since the last command: a
second ``summary`` or a ``report`` after it fetches nothing of a finished run. A compacted
run is one part per table and rank, so the requests grow with tables × ranks, not with
steps.

The cache lives in ``$TRACEALYZE_CACHE_DIR``, else ``$XDG_CACHE_HOME/tracealyze/runs``, else
``~/.cache/tracealyze/runs``. Deleting it is always safe.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from tracealyze.format.spool import Uploader
from tracealyze.format.storage import (
    Location,
    StoredFile,
    has_run,
    list_run,
    local_files,
    locate,
    read_bytes,
    run_file,
)

from ..errors import RunDirError, one_line
from ..writes import Dir, OutputError
from . import inplace

MANIFEST = ".tracealyze-mirror.json"
"""In each mirror: the URL and, per file, the (size, mtime) it was fetched at."""
T = TypeVar("T")
FETCH_THREADS = 8
"""Objects fetched at once: requests to a store are latency-bound, not CPU-bound."""


def cache_root() -> Path:
    env = os.environ.get("TRACEALYZE_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tracealyze" / "runs"


def _wanted(rel: str, tables: set[str] | None) -> bool:
    """Whether the file ``rel`` is needed to read ``tables`` (None: all of the run)."""
    kind = run_file(rel)
    if tables is None or kind in ("meta", "rank_meta"):
        return True
    if kind == "trace":
        return "trace_events" in tables
    return rel.split("/", 1)[0] in tables


def mirror(url: str, root: Path | None = None, tables: set[str] | None = None, *,
           whole: bool = False) -> Path:
    """The local mirror of the run at ``url``, brought up to date. RunDirError (one line)
    when the URL cannot be used, the store refuses or the prefix holds no run.

    The parts are read in place (:mod:`.inplace`: the byte ranges a query needs) unless
    ``whole``: then they are fetched whole, as every other file. ``tables``: only the parts
    (and raw traces) of these tables, and the metadata: ``query`` reads what its SQL names;
    the other tables read as empty."""
    try:
        loc = locate(url)
        files = list_run(loc)
    except (ValueError, OSError) as e:
        raise RunDirError(f"cannot read {url}: {one_line(e)}") from None
    if not has_run(files):
        raise RunDirError(f"not a run directory (no run.json): {url}")
    dest = _folder(loc.url, root)
    try:
        with Dir.open(dest, create=True) as folder:
            old = _manifest(dest)
            copied = [f for f in files if whole or run_file(f.rel) != "part"]  # (in place)
            stale = [f for f in copied if _wanted(f.rel, tables) and (
                old.get(f.rel) != [f.size, f.mtime_ns] or not (dest / f.rel).is_file())]
            with ThreadPoolExecutor(FETCH_THREADS) as pool:
                list(pool.map(lambda f: _fetch(folder, loc, f), stale))
            _prune(dest, {f.rel for f in copied})
            inplace.prune(dest, files)
            now = {f.rel: [f.size, f.mtime_ns] for f in files}
            fetched = {f.rel for f in stale}
            held = {rel: st for rel, st in now.items() if (dest / rel).is_file()
                    and (old.get(rel) == st or rel in fetched)}
            folder.write_atomic(MANIFEST, json.dumps({"url": loc.url, "files": held}),
                                durable=False)
    except (OSError, OutputError) as e:
        raise RunDirError(f"cannot read {url}: {one_line(e)}") from None
    if not whole:
        try:
            inplace.register(dest, loc, files, tables).prefetch_footers(FETCH_THREADS)
        except FileNotFoundError:
            pass  # (a part merged away since the listing: the footer check lists again)
    return dest


def into_store(url: str, write: Callable[[Path], T]) -> T:
    """``write(folder)`` on the run at ``url`` (``import-trace`` into a URL): on its local
    mirror (an empty one when the prefix holds no run yet), then every file it added or
    changed is uploaded, run.json last (format.spool: the same order as the recorder)."""
    try:
        loc = locate(url)
        holds = has_run(list_run(loc))
    except (ValueError, OSError) as e:
        raise RunDirError(f"cannot read {url}: {one_line(e)}") from None
    dest = mirror(url, whole=True) if holds else _folder(loc.url)
    try:
        Dir.open(dest, create=True).close()
    except OutputError as e:
        raise RunDirError(str(e)) from None
    before = local_files(dest)
    result = write(dest)
    # (what the store has already: given to the constructor, whose thread syncs at once;
    # set after it, a busy machine's first sync re-sent every part)
    up = Uploader(dest, loc, interval_s=3600.0, uploaded=before)
    if not up.close(60.0):
        raise RunDirError(f"imported into {dest}, but could not upload it to {url}")
    return result


def _fetch(folder: Dir, loc: Location, f: StoredFile) -> None:
    """Object ``f`` into the mirror, atomically, each folder of its name opened without
    following links. ``f.rel`` is a checked run-file name (format.storage.run_file: no
    ``..``, no absolute part), so it stays under the mirror."""
    *dirs, name = f.rel.split("/")
    with folder.walk(*dirs) as d:
        # (a cache: no fsync, as before; a torn mirror is fetched again by its manifest)
        d.write_atomic(name, read_bytes(loc, f.rel), durable=False)


def _folder(url: str, root: Path | None = None) -> Path:
    return (root or cache_root()) / hashlib.sha256(url.encode()).hexdigest()[:24]


def _manifest(dest: Path) -> dict[str, list[int | None]]:
    try:
        got = json.loads((dest / MANIFEST).read_text())
        files = got.get("files") if isinstance(got, dict) else None
        return files if isinstance(files, dict) else {}
    except (OSError, ValueError):
        return {}


def _prune(dest: Path, keep: set[str]) -> None:
    """Remove mirrored files the store no longer has (parts merged away since), and whole
    parts of a run now read in place."""
    for path in sorted(dest.rglob("*"), reverse=True):
        rel = path.relative_to(dest).as_posix()
        if rel.split("/", 1)[0] == inplace.RANGES:
            continue
        if path.is_file() and not path.is_symlink() and rel not in keep and rel != MANIFEST \
                and rel != "report.html":
            path.unlink()
