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

Each table file is replaced atomically (written to a temporary name, fsynced, renamed), so
a reader sees the old rows or the new, never a torn file. Concurrent ``fleet`` commands on
one index take an exclusive lock (``INDEX/.lock``) only to merge: each re-reads the index
under the lock and replaces just the rows of the runs it analysed, so neither loses the
other's work. The index is a local directory (a URL root's index defaults to the local
cache): object stores have no rename and no lock to make these two promises with.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..errors import RunDirError
from .discover import under

INDEX_FORMAT = 1
TABLES = ("runs", "findings", "ranks")

_F64, _I64, _STR = pa.float64(), pa.int64(), pa.string()
SCHEMAS: dict[str, pa.Schema] = {
    "runs": pa.schema([
        ("run_id", _STR), ("path", _STR), ("status", _STR), ("started", _F64),
        ("duration_s", _F64), ("heartbeat", _F64), ("stale_after_s", _F64), ("steps", _I64),
        ("world_size", _I64), ("hosts", pa.list_(_STR)), ("model_class", _STR),
        ("model_parameters", _I64), ("throughput_steps_per_s", _F64),
        ("peak_rss_bytes", _I64), ("peak_cuda_allocated_bytes", _I64),
        ("top_finding", _STR), ("top_severity", _STR), ("top_subject", _STR),
        ("top_first_step", _I64), ("n_info", _I64), ("n_warning", _I64), ("n_error", _I64),
        ("n_critical", _I64), ("error", _STR), ("fingerprint", _STR), ("analyzer", _STR),
        ("analysis_cpu_s", _F64), ("analysed_at", _F64)]),
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
    from tracealyze.format.storage import is_url

    if len(roots) == 1 and not is_url(roots[0]) and not any(c in roots[0] for c in "*?["):
        return Path(roots[0]) / "_tracealyze" / "fleet"
    import hashlib

    from ..run.remote import cache_root

    key = hashlib.sha1("\n".join(sorted(roots)).encode(), usedforsecurity=False).hexdigest()
    return cache_root() / "fleet" / key[:16]


class Index:
    """The index at ``path`` (created on first write). ``rows(table)`` reads it; ``merge``
    replaces the rows of some runs and drops runs no longer found."""

    def __init__(self, path: Path | str) -> None:
        from tracealyze.format.storage import is_url

        if is_url(str(path)):
            raise RunDirError(f"the fleet index must be a local directory, not {path} "
                              "(give --index PATH)")
        self.path = Path(path)

    def _file(self, table: str) -> Path:
        return self.path / table / "data.parquet"

    def exists(self) -> bool:
        return self._file("runs").is_file()

    def table(self, table: str) -> pa.Table:
        """The table as stored (empty with its schema when the index is new). An index
        written by another format version reads as empty: it is rebuilt."""
        f = self._file(table)
        if not f.is_file() or self.format_version() != INDEX_FORMAT:
            return SCHEMAS[table].empty_table()
        import pyarrow.parquet as pq

        try:
            t = pq.read_table(f)
        except (OSError, pa.ArrowException) as e:
            raise RunDirError(f"the fleet index {f} cannot be read ({e}); delete it to "
                              "rebuild it") from None
        if not t.schema.equals(SCHEMAS[table]):
            return SCHEMAS[table].empty_table()
        return t

    def rows(self, table: str) -> list[dict[str, Any]]:
        return self.table(table).to_pylist()

    def format_version(self) -> int | None:
        try:
            return int(json.loads((self.path / "index.json").read_text())["format"])
        except (OSError, ValueError, KeyError, TypeError):
            return INDEX_FORMAT if not self.path.exists() else None

    @contextmanager
    def _locked(self) -> Iterator[None]:
        import fcntl

        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.path / ".lock", "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # released when the file closes
            yield

    def merge(self, results: Sequence[dict[str, Any]], roots: Sequence[str],
              found: set[str]) -> dict[str, list[dict[str, Any]]]:
        """Under the lock: re-read the index, drop the rows of runs under ``roots`` not in
        ``found`` (deleted runs), replace the rows of the runs in ``results`` (each
        :func:`.analyse.analyse_run`'s output), write it back; returns the new rows."""
        with self._locked():
            mine = {r["run"]["path"] for r in results}

            def keep(row: dict[str, Any]) -> bool:
                p = row["path"]
                return p not in mine and (p in found or not under(p, roots))

            out: dict[str, list[dict[str, Any]]] = {}
            for table in TABLES:
                old = [r for r in self.rows(table) if keep(r)]
                if table == "runs":
                    new = [r["run"] for r in results]
                else:
                    new = [x for r in results for x in r[table]]
                out[table] = sorted(old + new, key=_order(table))
            for table in TABLES:
                self._write(table, out[table])
            _atomic_write(self.path / "index.json", json.dumps(
                {"format": INDEX_FORMAT, "updated": time.time(),
                 "runs": len(out["runs"])}).encode())
            return out

    def _write(self, table: str, rows: list[dict[str, Any]]) -> None:
        import pyarrow.parquet as pq

        schema = SCHEMAS[table]
        t = pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows],
                                 schema=schema)
        f = self._file(table)
        f.parent.mkdir(parents=True, exist_ok=True)
        sink = pa.BufferOutputStream()
        pq.write_table(t, sink, compression="zstd")
        _atomic_write(f, sink.getvalue().to_pybytes())


def _order(table: str) -> Any:
    if table == "runs":
        return lambda r: r["path"]
    if table == "findings":
        return lambda r: (r["path"], r["order"])
    return lambda r: (r["path"], r["rank"])


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
