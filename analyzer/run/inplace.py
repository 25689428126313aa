"""The parts of a run in object storage, read in place: DuckDB and the footer check ask for
byte ranges, and only those ranges are fetched (ranged GETs), so a query reads the footers
and the column chunks it needs, not whole files.

DuckDB reaches the store through an fsspec filesystem registered on each connection
(``tzstore://<mirror>/<table>/rank=<r>/part-*.parquet``): no DuckDB extension (machines may
be offline), and the connection's sandbox lists the run's own ``tzstore://`` prefix, nothing
else. The filesystem serves only the parts of the run's listing (checked names under the
run's prefix, :func:`tracealyze.format.storage.run_file`): a path a query makes up, another
bucket or a ``..`` is "no such file".

Fetched ranges are kept in the run's local mirror (``.ranges/<rel>@<size>-<mtime>``, a
sparse file, with the list of ranges it holds beside it): the next command reads them from
disk, and a footer checked by :mod:`.footers` is not fetched again for DuckDB. An object
rewritten in the store has another size or mtime, hence another cache file. A range is
listed only after its bytes are on disk; two commands filling one cache write the same
bytes. A cache that cannot be written is skipped: the bytes are then served from memory.
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from tracealyze.format.parts import part_range, rank_of, superseding
from tracealyze.format.parts import table_parts as local_table_parts
from tracealyze.format.storage import Location, StoredFile, list_run, run_file

from .rangecache import BLOCK, RANGES, RangeCache, RangeFile, prune

__all__ = ["BLOCK", "PROTOCOL", "RANGES", "RangeCache", "attach", "open_part", "prefixes", "prune",
           "register", "relist", "sql_path", "table_parts"]

PROTOCOL = "tzstore"

FOOTER = 64 * 1024
"""What Parquet readers read of a file's end first (pyarrow's default footer read size)."""

_RUNS: dict[Path, InPlaceRun] = {}
_IDS: dict[str, InPlaceRun] = {}
_REGISTRY = threading.Lock()


class InPlaceRun:
    """One run's parts in a store, as one command listed them."""

    def __init__(self, folder: Path, loc: Location, files: list[StoredFile],
                 tables: set[str] | None) -> None:
        self.dir, self.loc, self.id, self.tables = folder, loc, folder.name, tables
        self._lock = threading.Lock()
        self._caches: dict[str, RangeCache] = {}
        self.files = self._parts(files)

    def _parts(self, files: list[StoredFile]) -> dict[str, StoredFile]:
        return {f.rel: f for f in files if run_file(f.rel) == "part" and (
            self.tables is None or f.rel.split("/", 1)[0] in self.tables)}

    def relist(self) -> None:
        """List the store again (parts merged away while the run was read)."""
        fresh = self._parts(list_run(self.loc))
        with self._lock:
            self.files = fresh

    def cache(self, rel: str) -> RangeCache:
        with self._lock:
            f = self.files.get(rel)
            if f is None:
                raise FileNotFoundError(f"No such file: {self.loc.url}/{rel}")
            got = self._caches.get(rel)
            if got is None or got.f != f:
                got = self._caches[rel] = RangeCache(self.loc, f, self.dir / RANGES)
            return got

    def prefetch_footers(self, threads: int) -> None:
        """Fetch every part's tail (its footer: pyarrow reads the last 64 KiB), ``threads``
        at a time: the footer check that follows reads them one by one, and a store's
        round trip is tens of milliseconds. A part smaller than a block comes whole."""
        from concurrent.futures import ThreadPoolExecutor

        def tail(rel: str) -> None:
            c = self.cache(rel)
            c.read(max(0, c.f.size - FOOTER), FOOTER)

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(tail, list(self.files)))

    def table_parts(self, table: str) -> dict[int, list[Path]]:
        """rank -> the data parts of ``table`` (merged parts supersede what they cover)."""
        by_rank: dict[int, list[tuple[int, int, Path]]] = {}
        for rel in self.files:
            t, folder, name = rel.split("/")
            r, seqs = rank_of(folder), part_range(name)
            if t == table and r is not None and seqs is not None:
                by_rank.setdefault(r, []).append((*seqs, self.dir / rel))
        return {r: [p for _, _, p in superseding(found)[0]]
                for r, found in sorted(by_rank.items())}


def register(folder: Path, loc: Location, files: list[StoredFile],
             tables: set[str] | None = None) -> InPlaceRun:
    """Read the parts among ``files`` (the listing of the run at ``loc``, mirrored in
    ``folder``) in place; ``tables``: only these tables' (the others read as empty)."""
    folder = folder.resolve()
    run = InPlaceRun(folder, loc, files, tables)
    with _REGISTRY:
        _RUNS[folder] = _IDS[run.id] = run
    return run


def _run_of(path: Path) -> InPlaceRun | None:
    if not _RUNS:
        return None
    return _RUNS.get(path) or _RUNS.get(path.resolve())


def _part_owner(p: Path) -> tuple[InPlaceRun, str] | None:
    """The in-place run holding the part ``p`` (``<run>/<table>/rank=<r>/<part>``)."""
    if not _RUNS or len(p.parents) < 3:
        return None
    run = _RUNS.get(p.parents[2])
    return (run, p.relative_to(run.dir).as_posix()) if run is not None else None


def table_parts(run_dir: Path, table: str, *, fresh: bool = False) -> dict[int, list[Path]]:
    """format.parts.table_parts, or the store's listing for a run read in place (``fresh``:
    list the store again first)."""
    run = _run_of(run_dir)
    if run is None:
        return local_table_parts(run_dir, table)
    if fresh:
        run.relist()
    return run.table_parts(table)


def relist(run_dir: Path) -> None:
    """List the store again for a run read in place (nothing for a local run)."""
    run = _run_of(run_dir)
    if run is not None:
        run.relist()


def sql_path(p: Path) -> str:
    """The name DuckDB reads the part ``p`` by."""
    owner = _part_owner(p)
    return str(p) if owner is None else f"{PROTOCOL}://{owner[0].id}/{owner[1]}"


def open_part(p: Path) -> Any:
    """A pyarrow file to read the part ``p`` (FileNotFoundError when it is gone)."""
    import pyarrow as pa

    owner = _part_owner(p)
    if owner is None:
        return pa.OSFile(str(p))
    return pa.PythonFile(RangeFile(owner[0].cache(owner[1])), mode="r")


def prefixes(allowed: list[Path]) -> list[str]:
    """The ``tzstore://`` prefixes of the runs among ``allowed`` that are read in place."""
    out = []
    for d in allowed:
        run = _run_of(Path(d))
        if run is not None:
            out.append(f"{PROTOCOL}://{run.id}/")
    return out


def attach(con: Any) -> None:
    """Let ``con`` read ``tzstore://`` names (before its sandbox is set)."""
    con.register_filesystem(_filesystem())


@lru_cache(maxsize=1)
def _filesystem() -> Any:
    """The fsspec filesystem DuckDB reads ``tzstore://`` names through (made once: fsspec is
    imported only when a run is read from a store)."""
    from fsspec import AbstractFileSystem

    def split(path: str) -> tuple[InPlaceRun, str]:
        rest = path.split("://", 1)[-1].lstrip("/")
        ident, _, rel = rest.partition("/")
        run = _IDS.get(ident)
        if run is None or rel not in run.files:
            raise FileNotFoundError(f"No such file: {path}")
        return run, rel

    def entries(path: str) -> tuple[InPlaceRun | None, str]:
        ident, _, rel = path.split("://", 1)[-1].lstrip("/").partition("/")
        return _IDS.get(ident), rel.rstrip("/")

    class StoreFileSystem(AbstractFileSystem):  # type: ignore[misc]
        """``tzstore://<mirror>/<rel>``: the listed parts of the runs read in place."""

        protocol = PROTOCOL

        def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
            if mode != "rb":
                raise PermissionError(f"read-only: {path}")
            run, rel = split(path)
            return RangeFile(run.cache(rel))

        def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
            try:
                run, rel = split(path)
                return {"name": path, "size": run.files[rel].size, "type": "file"}
            except FileNotFoundError:
                if self.isdir(path):
                    return {"name": path, "size": 0, "type": "directory"}
                raise

        def isdir(self, path: str) -> bool:
            run, rel = entries(path)
            return run is not None and any(r.startswith(rel + "/") or not rel
                                           for r in run.files)

        def modified(self, path: str) -> _dt.datetime:
            run, rel = split(path)
            ns = run.files[rel].mtime_ns or 0
            return _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.timezone.utc)

        def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
            run, rel = entries(path)
            if run is None:
                raise FileNotFoundError(f"No such file: {path}")
            base = f"{PROTOCOL}://{run.id}/"
            names = sorted({base + (r if not rel else rel + "/" + r[len(rel) + 1:]
                                    .split("/")[0]) for r in run.files
                            if not rel or r.startswith(rel + "/")})
            return [self.info(n) for n in names] if detail else names

        def glob(self, path: str, **kwargs: Any) -> list[str]:
            run, pattern = entries(path)
            if run is None:
                return []
            base = f"{PROTOCOL}://{run.id}/"
            if not any(ch in pattern for ch in "*?["):  # DuckDB globs every name it reads
                return [base + pattern] if pattern in run.files else []
            return [base + r for r in sorted(run.files) if fnmatch.fnmatchcase(r, pattern)]

        def mkdir(self, path: str, *args: Any, **kwargs: Any) -> None:
            raise PermissionError(f"read-only: {path}")

    return StoreFileSystem()
