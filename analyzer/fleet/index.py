"""The fleet index: every analysed run's rows, kept between ``fleet`` commands.

Layout (a Hive-style directory Spark, DuckDB, pandas or any Parquet reader opens as it is)::

    INDEX/runs/data.parquet       one row per run (run_id a real column)
    INDEX/findings/data.parquet   one row per finding per run
    INDEX/ranks/data.parquet      one row per rank per run (host, step times)
    INDEX/index.json              format version, analyzer version, last update

Why not Iceberg, Delta or DuckLake: the index is small (one row per run: 10,000 runs are a
few MB), rewritten whole on each update, and must be readable offline by every Parquet
reader; a table format's log and manifests would add a dependency (DuckLake and DuckDB's
Delta/Iceberg readers are extensions downloaded at run time) without saving a request: a
fleet query reads three objects, whatever the number of runs and parts.

Each table file is replaced atomically (written to a new temporary file, fsynced, renamed)
through :mod:`..writes`, so a reader sees the old rows or the new, never a torn file; the
default index ``ROOT/_tracealyze/fleet`` lies in a folder strangers can write to, so each of
its folders is opened without following a link, and nothing is ever written through one.
Concurrent ``fleet`` commands on one index take an exclusive lock (``INDEX/.lock``) only to
merge: each re-reads the index under the lock and replaces just the rows of the runs it
analysed, so neither loses the other's work. The index is a local directory (a URL root's
index defaults to the local cache): object stores have no rename and no lock to make these
two promises with.

What is read back is read as data from strangers (:mod:`.bounded`): tables larger than a
fleet's are refused and rebuilt, and a row whose path lies outside the command's roots is
dropped (a stranger's row must not make the analyzer read, or report, another folder).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..errors import RunDirError
from ..writes import Dir, OutputError
from .bounded import MAX_JSON_BYTES, TABLE_FILE, Read, folder, read_table, row_bound
from .discover import INDEX_DIR
from .trust import under, wild

INDEX_FORMAT = 1
TABLES = ("runs", "findings", "ranks")

_F64, _I64, _STR = pa.float64(), pa.int64(), pa.string()
SCHEMAS: dict[str, pa.Schema] = {
    "runs": pa.schema([
        ("run_id", _STR), ("path", _STR), ("status", _STR), ("started", _F64),
        ("duration_s", _F64), ("heartbeat", _F64), ("stale_after_s", _F64), ("steps", _I64),
        ("world_size", _I64), ("hosts", pa.list_(_STR)), ("model_class", _STR),
        ("model_parameters", _I64), ("hparams", pa.map_(_STR, _STR)),
        ("throughput_steps_per_s", _F64),
        ("peak_rss_bytes", _I64), ("peak_cuda_allocated_bytes", _I64),
        ("top_finding", _STR), ("top_severity", _STR), ("top_subject", _STR),
        ("top_first_step", _I64), ("n_info", _I64), ("n_warning", _I64), ("n_error", _I64),
        ("n_critical", _I64), ("error", _STR), ("fingerprint", _STR), ("analyzer", _STR),
        ("analysis_cpu_s", _F64), ("analysed_at", _F64), ("tables", pa.list_(_STR))]),
    "findings": pa.schema([
        ("run_id", _STR), ("path", _STR), ("order", _I64), ("id", _STR), ("severity", _STR),
        ("subject", _STR), ("title", _STR), ("first_step", _I64), ("message", _STR)]),
    "ranks": pa.schema([
        ("run_id", _STR), ("path", _STR), ("rank", _I64), ("host", _STR), ("steps", _I64),
        ("median_step_s", _F64), ("median_compute_s", _F64), ("median_data_wait_s", _F64),
        ("straggler", pa.bool_())]),
}


def default_index(roots: Sequence[str]) -> Path:
    """``ROOT/_tracealyze/fleet`` for one local root; for several roots or a URL, a folder
    of the local cache named after the roots."""
    root = _local_root(roots)
    if root is not None:
        return Path(root) / INDEX_DIR / "fleet"
    import hashlib

    from ..run.remote import cache_root

    key = hashlib.sha1("\n".join(sorted(roots)).encode(), usedforsecurity=False).hexdigest()
    return cache_root() / "fleet" / key[:16]


def _local_root(roots: Sequence[str]) -> str | None:
    """The one local root whose own index is ``ROOT/_tracealyze/fleet``, if there is one."""
    from tracealyze.format.storage import is_url

    if len(roots) == 1 and not is_url(roots[0]) and not wild(roots[0]):
        return roots[0]
    return None


def _text(s: str) -> str:
    """``s`` as UTF-8 text (a lone surrogate, from a ``\\ud800`` in a run's JSON, as ``?``):
    Parquet holds only UTF-8."""
    return s.encode("utf-8", "replace").decode("utf-8")


def _conform(v: Any, typ: pa.DataType) -> Any:
    """``v`` as a value of ``typ``, or None: a row is built from a stranger's run.json, and
    one odd value (a string where a count goes, 2**70) must not stop the index's write."""
    if v is None:
        return None
    if pa.types.is_string(typ):
        return _text(v) if isinstance(v, str) else None
    if pa.types.is_boolean(typ):
        return v if isinstance(v, bool) else None
    if isinstance(v, bool):
        return None
    if pa.types.is_integer(typ):
        return v if isinstance(v, int) and -(1 << 63) <= v < (1 << 63) else None
    if pa.types.is_floating(typ):
        try:
            return float(v) if isinstance(v, (int, float)) else None
        except OverflowError:
            return None
    if pa.types.is_map(typ):
        return [(_text(k), _text(x)) for k, x in v.items()
                if isinstance(k, str) and isinstance(x, str)] if isinstance(v, dict) else None
    if pa.types.is_list(typ) and isinstance(v, list):
        return [x for x in (_conform(i, typ.value_type) for i in v) if x is not None]
    return None


def table_of(table: str, rows: Sequence[dict[str, Any]]) -> pa.Table:
    """``rows`` as the index table ``table`` (each value conformed to its column)."""
    schema = SCHEMAS[table]
    return pa.Table.from_pylist(
        [{f.name: _conform(r.get(f.name), f.type) for f in schema} for r in rows],
        schema=schema)


def paths(t: pa.Table) -> list[str | None]:
    """The ``path`` of each row of an index table."""
    return t.column("path").to_pylist()


def select(t: pa.Table, keep: set[str]) -> pa.Table:
    """The rows of ``t`` whose path is in ``keep``."""
    return t.filter(pa.array([p in keep for p in paths(t)], pa.bool_()))


ORDER = {"runs": [("path", "ascending")],
         "findings": [("path", "ascending"), ("order", "ascending")],
         "ranks": [("path", "ascending"), ("rank", "ascending")]}


class Index:
    """The index at ``path`` (created on first write). ``read()`` reads it, bounded;
    ``merge`` replaces the rows of some runs and drops runs no longer found.

    ``root``: the local fleet root whose own index this is (``root/_tracealyze/fleet``,
    opened folder by folder without following links). ``own``: the index belongs to the
    command's roots (a default index), so a row of a path outside them is a forgery and is
    dropped; an index the user names may be shared by commands over other roots, whose rows
    are kept (and never read by this command)."""

    def __init__(self, path: Path | str, *, root: str | None = None, own: bool = False
                 ) -> None:
        from tracealyze.format.storage import is_url

        if is_url(str(path)):
            raise RunDirError(f"the fleet index must be a local directory, not {path} "
                              "(give --index PATH)")
        self.path, self.root, self.own = Path(path), root, own

    @classmethod
    def of(cls, roots: Sequence[str], index: str | Path | None = None) -> Index:
        """The index the user named, else the roots' default one."""
        if index is not None:
            return cls(index)
        return cls(default_index(roots), root=_local_root(roots), own=True)

    def _open(self) -> Dir:
        """The index folder, made if missing, for writing."""
        if self.root is not None:
            with Dir.open(self.root) as top:
                return top.walk(INDEX_DIR, "fleet")
        return Dir.open(self.path, create=True)

    def _open_read(self, read: Read) -> Dir | None:
        """The index folder for reading; None when there is none (or a link is where one of
        the default index's folders should be: said in ``read``)."""
        try:
            top = Dir.open(self.root if self.root is not None else self.path)
        except OutputError:
            return None  # absent (a write says why, if it is something else)
        if self.root is None:
            return top
        with top:
            sub = folder(top, INDEX_DIR, read)
            if sub is None:
                return None
            with sub:
                return folder(sub, "fleet", read)

    def read(self) -> Read:
        """The index's tables (empty, with their schema, when there is none, when it is of
        another format, or when any table is refused: then it is rebuilt whole)."""
        read = Read()
        d = self._open_read(read)
        if d is not None:
            with d:
                self._read_in(d, read)
        if not read.tables:
            read.tables = {t: SCHEMAS[t].empty_table() for t in TABLES}
        return read

    def _read_in(self, d: Dir, read: Read) -> None:
        try:
            meta = json.loads(d.read_bytes("index.json", MAX_JSON_BYTES) or b"null")
        except ValueError:
            meta = None
        if not isinstance(meta, dict) or meta.get("format") != INDEX_FORMAT:
            return  # none yet, another format's, or not ours: rebuilt
        runs = read_table(d, "runs", SCHEMAS["runs"], row_bound("runs", 0), read)
        if runs is None:
            return
        tables = {"runs": runs}
        for t in ("findings", "ranks"):
            got = read_table(d, t, SCHEMAS[t], row_bound(t, runs.num_rows), read)
            if got is None:  # rows of runs without their findings: rebuilt whole
                return
            tables[t] = got
        read.tables, read.present = tables, True

    def merge(self, results: Sequence[dict[str, Any]], roots: Sequence[str],
              found: set[str]) -> dict[str, pa.Table]:
        """Under the lock: re-read the index, drop the rows of runs under ``roots`` not in
        ``found`` (deleted runs) and, in a default index, rows outside ``roots`` (forged),
        replace the rows of the runs in ``results`` (each :func:`.analyse.analyse_run`'s
        output), write it back; returns the new tables."""
        with self._open() as d, d.locked(".lock"):
            read = Read()
            self._read_in(d, read)
            old = read.tables or {t: SCHEMAS[t].empty_table() for t in TABLES}
            mine = {r["run"]["path"] for r in results}
            kept = {p for p in paths(old["runs"]) if p is not None and p not in mine and (
                p in found or (not self.own and not under(p, roots)))}
            out: dict[str, pa.Table] = {}
            for table in TABLES:
                new = [r["run"] for r in results] if table == "runs" else \
                    [x for r in results for x in r[table]]
                out[table] = pa.concat_tables([select(old[table], kept),
                                               table_of(table, new)]).sort_by(ORDER[table])
            for table in TABLES:
                with d.sub(table) as sub:
                    sub.write_atomic(TABLE_FILE, _parquet(out[table]))
            d.write_atomic("index.json", json.dumps(
                {"format": INDEX_FORMAT, "updated": time.time(),
                 "runs": out["runs"].num_rows}).encode())
            return out


def _parquet(t: pa.Table) -> bytes:
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(t, sink, compression="zstd")
    return sink.getvalue().to_pybytes()
