"""Part files of the run directory: names, sequence numbers, atomic writes, compaction.

Layout (docs/FORMAT.md)::

    <table>/rank=<r>/part-<seq>.parquet        one flush (seq 6+ digits, from 000001)
    <table>/rank=<r>/part-<a>-<b>.parquet      parts a..b merged (supersedes what it covers)

Only regular files (never symbolic links) whose name matches ``part-*.parquet`` are data;
anything else (``*.tmp``, dot-files) is an unfinished write. A merged part supersedes every
single or merged part whose range it contains: a kill between a merge's rename and its
deletes leaves both, and a correct reader counts the rows once.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from .schema import PARTITION, TABLES

PART_RE = re.compile(r"^part-(\d{1,12})(?:-(\d{1,12}))?\.parquet$")
RANK_DIR_RE = re.compile(r"^rank=(\d{1,10})$")
RANK_FILE_RE = re.compile(r"^rank=(\d{1,10})\.json$")
SNAPSHOT_DIR = "memory_snapshots"
"""``memory_snapshots/rank=<r>/``: the CUDA allocator's own snapshots (PyTorch's pickle)."""
SNAPSHOT_RE = re.compile(r"^oom-step(\d{6,12})\.pickle$")
T = TypeVar("T")
MAX_RANK = 2**31 - 1
"""Ranks are int32 (the partition's type in every reader)."""

COMPACT_FANOUT = 16
"""The writer merges this many single parts into one, and this many merged parts of a
similar size into one (a size-tiered scheme): a killed run of N flushes leaves
O(fanout × log_fanout N) files per table, not N."""


def part_name(seq: int) -> str:
    return f"part-{seq:06d}.parquet"


def merged_name(first: int, last: int) -> str:
    return f"part-{first:06d}-{last:06d}.parquet"


def rank_of(name: str, pattern: re.Pattern[str] = RANK_DIR_RE) -> int | None:
    """The rank in ``rank=<r>`` (or ``rank=<r>.json``), None if not one or out of range."""
    m = pattern.match(name)
    if m is None:
        return None
    r = int(m.group(1))
    return r if r <= MAX_RANK else None


def rank_dir(run_dir: Path, table: str, rank: int) -> Path:
    return run_dir / table / f"{PARTITION}={rank}"


def is_regular(path: Path) -> bool:
    """A regular file that is not a symbolic link (a link could point outside the run)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def is_real_dir(path: Path) -> bool:
    """A directory that is not a symbolic link."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _ranges(folder: Path) -> list[tuple[int, int, Path]]:
    out = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return out
    for e in entries:
        seqs = part_range(e.name)
        if seqs is not None and e.is_file(follow_symlinks=False):
            out.append((*seqs, Path(e.path)))
    return out


def part_range(name: str) -> tuple[int, int] | None:
    """(first, last) sequence of a part file's name; None if not a part's name."""
    m = PART_RE.match(name)
    if m is None:
        return None
    a = int(m.group(1))
    b = int(m.group(2)) if m.group(2) else a
    return (a, b) if b >= a else None


def top_level(folder: Path) -> tuple[list[tuple[int, int, Path]], list[Path]]:
    """(files that are data, files superseded by a merged part) of one rank folder, data
    in sequence order."""
    return superseding(_ranges(folder))


def superseding(ranges: Iterable[tuple[int, int, T]]) -> tuple[list[tuple[int, int, T]], list[T]]:
    """(the parts that are data, the parts a merged part supersedes) among one rank
    folder's ``(first, last, part)``, data in sequence order: the rule of :func:`top_level`
    for any listing (a bucket's, too)."""
    found = sorted(ranges, key=lambda x: (x[0], -x[1]))
    kept: list[tuple[int, int, T]] = []
    covered: list[T] = []
    end = -1  # ranges are sorted by start, widest first: nested ones start before `end`
    for a, b, p in found:
        if kept and a <= end and b <= end:
            covered.append(p)
            continue
        kept.append((a, b, p))
        end = max(end, b)
    return kept, covered


def data_parts(folder: Path) -> list[Path]:
    """The data files of one ``<table>/rank=<r>`` folder, oldest first."""
    return [p for _, _, p in top_level(folder)[0]]


def table_parts(run_dir: Path, table: str) -> dict[int, list[Path]]:
    """rank -> data files of ``table`` (rank folders that are links are not followed)."""
    out: dict[int, list[Path]] = {}
    tdir = run_dir / table
    if not is_real_dir(tdir):
        return out
    for entry in sorted(os.scandir(tdir), key=lambda e: e.name):
        r = rank_of(entry.name)
        if r is not None and entry.is_dir(follow_symlinks=False):
            out[r] = data_parts(Path(entry.path))
    return out


def next_seq_in(folder: Path) -> int:
    """One past the highest part sequence in one rank folder."""
    return max((b for _, b, _ in _ranges(folder)), default=0) + 1


def next_seq(run_dir: Path, rank: int, tables: Iterable[str] = TABLES) -> int:
    """One past the highest part sequence of ``rank`` over ``tables``."""
    best = 0
    for t in tables:
        for _, b, _ in _ranges(rank_dir(run_dir, t, rank)):
            best = max(best, b)
    return best + 1


def remove_stale_tmp(run_dir: Path, rank: int) -> None:
    """Temporary files of a killed writer are unfinished writes: delete them."""
    for t in TABLES:
        d = rank_dir(run_dir, t, rank)
        if is_real_dir(d):
            for p in d.glob(".*.tmp"):
                try:
                    p.unlink()
                except OSError:
                    pass


def make_writable_dir(path: Path) -> None:
    """Create ``path`` (and its parents) and prove it takes a file: OSError if not. Run
    before anything is started, so that an unwritable run_dir is one clear error."""
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".tracealyze-write-test.{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_parquet_atomic(tables: Any, final: Path, *, replace: bool = True) -> Path:
    """Write one pyarrow table (or stream an iterable of tables; each is cast to the first's
    schema) to a temporary name, fsync, and rename to ``final``. ``replace=False`` never
    overwrites: the next free sequence number is taken instead (several writers)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = final.with_name(f".{final.name}.{os.getpid()}.{id(tables):x}.tmp")
    it = iter([tables] if isinstance(tables, pa.Table) else tables)
    first = next(it)
    schema = first.schema
    floats = [f.name for f in schema if f.type in (pa.float32(), pa.float64())]
    try:
        with open(tmp, "wb") as fh:
            with pq.ParquetWriter(
                fh, schema, compression="zstd", compression_level=3,
                use_dictionary=[f.name for f in schema
                                if pa.types.is_dictionary(f.type) or f.type == pa.string()],
                # float columns compress far better split into byte streams before zstd
                use_byte_stream_split=floats or False,
            ) as pw:
                pw.write_table(first)
                for t in it:
                    pw.write_table(t.select(schema.names).cast(schema))
            fh.flush()
            os.fsync(fh.fileno())
        if replace:
            os.replace(tmp, final)
        else:
            final = _link_free(tmp, final)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    _fsync_dir(final.parent)
    return final


def _link_free(tmp: Path, final: Path) -> Path:
    m = PART_RE.match(final.name)
    seq = int(m.group(1)) if m else 1
    while True:
        try:
            os.link(tmp, final)  # link + unlink: refuses to overwrite another writer's part
        except FileExistsError:
            seq += 1
            final = final.with_name(part_name(seq))
            continue
        tmp.unlink()
        return final


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON to a temporary name, fsync and rename: readers never see half a file."""
    import orjson

    # orjson: run.json is rewritten at every flush from the writer thread, where the
    # standard library's indented (pure-Python) encoder took ~1 ms of CPU per file.
    write_bytes_atomic(path, orjson.dumps(data, option=orjson.OPT_INDENT_2
                                          | orjson.OPT_NON_STR_KEYS
                                          | orjson.OPT_SERIALIZE_NUMPY, default=str))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """``data`` to a temporary name, fsync and rename (creating the folder): a killed
    process leaves no half file under ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _read(paths: list[Path], schema: Any) -> Iterator[Any]:
    import pyarrow.parquet as pq

    for p in paths:
        t = pq.read_table(p)
        if PARTITION in t.column_names and PARTITION not in schema.names:
            t = t.drop_columns([PARTITION])  # a schema_version 1 part
        yield t.select(schema.names).cast(schema) if t.schema != schema else t


def _merge(folder: Path, group: list[tuple[int, int, Path]], table: str) -> int:
    """Merge ``group`` (consecutive data files) into one part; files removed."""
    from .schema import arrow_schema

    schema = arrow_schema(table)
    first, last = group[0][0], max(b for _, b, _ in group)
    final = folder / merged_name(first, last)
    # Streamed one part at a time: memory stays bounded by the largest part.
    write_parquet_atomic(_read([p for _, _, p in group], schema), final)
    removed = 0
    for _, _, p in group:
        if p != final:
            try:
                p.unlink()
                removed += 1
            except OSError:
                pass
    return removed


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def compact(folder: Path, table: str, *, fanout: int = COMPACT_FANOUT,
            final: bool = False) -> int:
    """Merge small parts of one rank folder; returns the number of files merged away.

    Crash-safe: a merged file appears atomically before its inputs are deleted, and readers
    skip what a merged part covers. ``final`` (at close): merge every data file into one.
    Otherwise size-tiered: ``fanout`` single parts become one merged part, and the newest
    ``fanout`` merged parts become one when their sizes are within 8x of each other (or
    when there are twice that many, whatever their sizes), so the count stays logarithmic.
    """
    kept, covered = top_level(folder)
    for p in covered:  # left by a kill between an earlier merge's rename and its deletes
        try:
            p.unlink()
        except OSError:
            pass
    if final:
        return _merge(folder, kept, table) if len(kept) > 1 else 0
    removed = 0
    merged_end = max((b for a, b, _ in kept if a != b), default=-1)
    singles = [k for k in kept if k[0] == k[1] and k[0] > merged_end]
    if len(singles) >= fanout:
        removed += _merge(folder, singles, table)
        kept, _ = top_level(folder)
    while True:
        merged = [k for k in kept if k[0] != k[1]]
        if len(merged) < fanout:
            return removed
        tail = merged[-fanout:]
        sizes = [_size(p) for _, _, p in tail]
        if len(merged) < 2 * fanout and max(sizes) > 8 * max(1, min(sizes)):
            return removed
        removed += _merge(folder, tail, table)
        kept, _ = top_level(folder)
