"""``run_fleet``: find the runs under the roots, analyse the new and changed ones (and
running ones whose heartbeat went stale), keep every row in the index, and find the bad
hosts across runs. The facade the CLI and users call."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..diagnosis.findings import severity_rank
from ..errors import ConfigError
from . import engines
from .analyse import analyzer_version
from .discover import RunRef, Skipped, discover, shown
from .hosts import suspect_hosts
from .index import TABLES, Index, paths, select
from .trust import Roots

FLEET_JSON_VERSION = 1


@dataclass
class FleetResult:
    """The fleet under some roots: one row per run, the findings of each run, and the
    fleet's own findings (``suspect_host``)."""

    runs: list[dict[str, Any]]
    findings: list[dict[str, Any]]
    ranks: list[dict[str, Any]]
    fleet_findings: list[dict[str, Any]]
    index: Path
    engine: str
    analysed: int = 0
    """Runs analysed by this command (new, changed, or running and gone stale)."""
    reused: int = 0
    """Runs whose row came from the index unchanged."""
    removed: int = 0
    """Rows dropped from the index: runs that no longer exist under the roots."""
    elapsed_s: float = 0.0
    roots: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    """Entries under the roots that were not analysed, each with why."""
    warnings: list[str] = field(default_factory=list)
    """What was wrong with the index (refused tables, forged rows dropped): one line each."""

    def to_json(self) -> dict[str, Any]:
        from ..diagnosis.summary import clean_json

        return clean_json({
            "schema_version": FLEET_JSON_VERSION, "roots": self.roots,
            "index": str(self.index), "engine": self.engine, "analysed": self.analysed,
            "reused": self.reused, "removed": self.removed,
            # (the index's MAP column reads back as key/value pairs: an object here)
            "runs": [{**r, "hparams": dict(r["hparams"])} if isinstance(
                r.get("hparams"), list) else r for r in self.runs],
            "fleet_findings": self.fleet_findings,
            "skipped": [s.to_json() for s in self.skipped], "warnings": self.warnings,
        })


def needs_analysis(row: dict[str, Any] | None, ref: RunRef, version: str, now: float) -> bool:
    """A run is analysed again when it is new, its files changed (fingerprint), the
    analyzer changed, or it was running and its heartbeat is now stale (killed: no file
    changes when a process dies)."""
    if row is None or row.get("fingerprint") != ref.fingerprint or row.get("analyzer") != version:
        return True
    hb, stale = row.get("heartbeat"), row.get("stale_after_s")
    return row.get("status") == "running" and hb is not None and stale is not None \
        and now - hb > stale


def run_fleet(roots: Sequence[str | Path], *, engine: str = "local", jobs: int | None = None,
              index: str | Path | None = None, spark_master: str | None = None,
              progress: engines.Progress | None = None) -> FleetResult:
    """Analyse the fleet under ``roots`` (directories, globs, object-store prefixes) and
    update its index (default :func:`.index.default_index`). RunDirError for a root that
    does not exist; ConfigError for a bad engine or jobs."""
    if engine not in ("local", "spark"):
        raise ConfigError(f"unknown engine {engine!r} (local or spark)")
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be ≥ 1, got {jobs}")
    t0 = time.perf_counter()
    roots = [str(r) for r in roots]
    if not roots:
        raise ConfigError("no fleet root given")
    skipped: list[Skipped] = []
    refs = discover(roots, skipped)
    idx = Index.of(roots, index)
    read = idx.read()
    found = {r.path for r in refs}
    have = {r["path"]: r for r in select(read.tables["runs"], found).to_pylist()}
    version, now = analyzer_version(), time.time()
    todo = [r for r in refs if needs_analysis(have.get(r.path), r, version, now)]
    results = engines.run(engine, todo, jobs=jobs, spark_master=spark_master,
                          progress=progress) if todo else []
    # rows of runs not found: deleted runs, or rows a stranger forged (a path outside the
    # roots, or through a link under them): dropped either way, the forged ones said
    check, why = Roots(roots), dict[str | None, str | None]()
    gone = [p for p in paths(read.tables["runs"]) if p not in found]
    for p in gone:
        if p not in why:  # (each path checked once, however many rows name it)
            why[p] = check.why_not(p)
    removed = sum(1 for p in gone if why[p] is None)
    forged = [p for p in gone if why[p] is not None and (
        idx.own or why[p] != "not under the roots")]  # (a shared index: other roots' rows)
    warnings = list(read.warnings)
    if forged:
        warnings.append(f"dropped {len(forged)} row(s) of the fleet index naming no run under "
                        f"the roots (e.g. {shown(str(forged[0]))[:200]}): never read")
    if results or removed or forged or not read.present:
        tables = idx.merge(results, roots, found)
    else:  # nothing changed: the index is current, nothing is written
        tables = read.tables
    mine = {t: select(tables[t], found).to_pylist() for t in TABLES}
    return FleetResult(
        runs=sort_worst_first(mine["runs"]), findings=mine["findings"], ranks=mine["ranks"],
        fleet_findings=suspect_hosts(mine["ranks"]), index=idx.path, engine=engine,
        analysed=len(results), reused=len(refs) - len(results), removed=removed,
        elapsed_s=time.perf_counter() - t0, roots=roots, skipped=skipped, warnings=warnings)


STATUS_ORDER = {"unreadable": 4, "crashed": 3, "killed": 2, "running": 1, "completed": 0}


def run_severity(row: dict[str, Any]) -> str | None:
    """The row's worst: its top finding's severity, or error for a run that cannot be read."""
    if row.get("status") == "unreadable":
        return "error"
    return row.get("top_severity")


def sort_worst_first(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Worst severity first, then crashed/killed before running before completed, then the
    most recent start."""
    return sorted(rows, key=lambda r: (-severity_rank(run_severity(r) or "info")
                                       if run_severity(r) else 1,
                                       -STATUS_ORDER.get(r.get("status") or "", 0),
                                       -(r.get("started") or 0), r["path"]))


def fails(result: FleetResult, fail_on: str) -> bool:
    """Some run's worst finding, or a fleet finding, is at least ``fail_on``."""
    bar = severity_rank(fail_on)
    sev = [run_severity(r) for r in result.runs] + [f["severity"] for f in
                                                    result.fleet_findings]
    return any(s is not None and severity_rank(s) >= bar for s in sev)
