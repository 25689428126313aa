"""An opened run (``Run``) and a connection holding run views (``Views``): what open_run
and open_runs return. Built by catalog.scan_run; its views by views.build_views."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Self

from tracealyze.format.parts import rank_of
from tracealyze.format.runmeta import Liveness

from ..sql.safe import read_arrow, read_query
from ..sql.schema import TABLE_NAMES


class Views:
    """A DuckDB connection with the run views (one run's, or several runs'): read-only
    ``query``, and ``close`` / ``with``."""

    con: Any = None  # duckdb.DuckDBPyConnection

    def query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run one read-only SQL statement; ``(column names, rows)``. QueryError on failure."""
        return read_query(self.con, sql)

    def arrow(self, sql: str) -> Any:
        """The same read as :meth:`query`, as a ``pyarrow.Table``: ``.to_pandas()``, or
        ``polars.from_arrow(...)``, in a notebook. QueryError on failure."""
        return read_arrow(self.con, sql)

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Run(Views):
    """An opened run directory. Use :func:`open_run`; close with ``.close()`` or ``with``."""

    def __init__(self, run_dir: Path, meta: dict[str, Any]) -> None:
        self.run_dir: Path = run_dir
        self.url: str | None = None
        """The object-storage URL the run was read from (``run_dir`` is then its mirror)."""
        self.meta: dict[str, Any] = meta
        self.rank_meta: dict[int, dict[str, Any]] = {}
        self.skipped_parts: list[tuple[Path, str]] = []
        self.meta_problems: list[str] = []
        self.part_rows: dict[Path, int] = {}  # rows of each readable part (its footer)
        """Fields of run.json / rank files left out for their type (format.metaschema)."""
        self.files: dict[str, list[Path]] = {t: [] for t in TABLE_NAMES}
        self.raw_traces: list[tuple[int, Path]] = []
        self.snapshots: list[tuple[int, Path]] = []
        """The CUDA allocator's snapshots under ``memory_snapshots/rank=<r>/`` (rank, file)."""
        self.ranks: list[int] = []
        self.con: Any = None  # duckdb.DuckDBPyConnection, set by open_run
        self._now = time.time()

    # ------------------------------------------------------------------ status

    @property
    def run_id(self) -> str:
        return str(self.meta.get("run_id", ""))

    @property
    def where(self) -> str:
        """Where the run was read from: its URL, else its directory."""
        return self.url or str(self.run_dir)

    @property
    def folder_name(self) -> str:
        """The run's folder name (a run read from a store: the last part of its URL, not
        its cache folder's)."""
        return self.url.rstrip("/").rsplit("/", 1)[-1] if self.url else self.run_dir.name

    @property
    def liveness(self) -> Liveness:
        """The format's rule (``tracealyze.format.runmeta``): running, finished or killed."""
        return Liveness(self.meta, self.rank_meta, self._now)

    @property
    def status(self) -> str:
        """completed | crashed | running (FORMAT.md: crashed if any rank crashed, else running
        if any rank runs, else completed). A killed run stays ``running``: see :attr:`killed`."""
        return self.liveness.status

    @property
    def stale_after_s(self) -> float:
        """Heartbeat age beyond which a ``running`` rank is presumed killed."""
        return self.liveness.stale_after_s

    def heartbeat(self, rank: int | None = None) -> float | None:
        """Last heartbeat (epoch s) of ``rank`` (or the newest of all), None if unknown."""
        return self.liveness.heartbeat(rank)

    def heartbeat_age_s(self, rank: int | None = None) -> float | None:
        """Seconds since the last heartbeat (of ``rank`` or the newest), None if unknown."""
        return self.liveness.age_s(rank)

    def stale_ranks(self, max_age_s: float | None = None) -> list[int]:
        """Ranks still marked running whose heartbeat is older than ``max_age_s`` (default
        :attr:`stale_after_s`)."""
        return self.liveness.stale_ranks(max_age_s)

    @property
    def killed(self) -> bool:
        """Status ``running`` but a running rank's heartbeat is stale: killed without a word."""
        return self.liveness.killed

    @property
    def in_progress(self) -> bool:
        """Status ``running`` and every running rank's heartbeat is fresh."""
        return self.liveness.in_progress

    # ------------------------------------------------------------------ data

    def tables(self) -> list[tuple[str, list[tuple[str, str]], int]]:
        """``[(view name, [(column, duckdb type), ...], row count), ...]`` in DESIGN order."""
        out = []
        for name in TABLE_NAMES:
            cols = [(r[0], r[1]) for r in self.con.execute(f"DESCRIBE {name}").fetchall()]
            (count,) = self.con.execute(f"SELECT count(*) FROM {name}").fetchone()
            out.append((name, cols, int(count)))
        return out

    def table_ranks(self, table: str) -> list[int]:
        """Ranks that have readable parts of ``table`` (from the file layout: no scan)."""
        out = {rank_of(f.parent.name) for f in self.files.get(table, [])}
        return sorted(r for r in out if r is not None)

    def row_count(self, table: str) -> int:
        (n,) = self.con.execute(f"SELECT count(*) FROM {table}").fetchone()
        return int(n)

    def __repr__(self) -> str:
        return f"Run({str(self.run_dir)!r}, status={self.status!r}, ranks={self.ranks})"
