"""Hostile cases built on disk: the features, a case's folders, and what is planted."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tests.runfactory import make_run, write_run_json

BOUND_S = 30.0
"""Wall time one command may take (the frozen-store case is tested elsewhere)."""
DEPTH = 1_500
"""Levels of a planted folder chain: deeper than Python's recursion limit (1,000), so any
recursive walk (os.walk and shutil.rmtree on 3.11, Path.rglob) fails on it."""
SECRET = "S3CR3T-outside-7f3a"
"""In every value of the outside run and every forged index row: seen in an output, it
proves the analyzer read what a stranger pointed it at."""
HOSTILE_NAME = "evil'; COPY (SELECT 1) TO 'pwned.csv'; --\n\"{rank}\"\t{}%s"
PID_SPAN = 32
"""Temporaries named after a pid are planted for os.getpid() ± this (the old naming)."""

FEATURES: tuple[str, ...] = (
    "run_links",        # links at report.html, .report.html.<pid>.tmp, traces/, ... in RUN
    "run_json_link",    # RUN/run.json is a link (import-trace rewrites run.json)
    "cwd_link",         # ./<run-name>.html (and its pid temporaries) are links
    "output_links",     # the -o files (report.html, fleet.html, fleet-reports/) are links
    "report_into_run",  # report -o RUN/report.html instead of declared/report.html
    "hostile_names",    # RUN's folder, run_id, tensor names, events, trace_id: quotes, \n, {}
    "bare_run",         # RUN holds only run.json (completed)
    "deep_in_run",      # a DEPTH-deep folder chain inside RUN
    "non_utf8_in_run",  # a part and a folder in RUN whose names are not UTF-8
    "index_dir_link",   # ROOT/_tracealyze links to honeydir (which holds a forged index)
    "index_lock_links",  # .lock and .index.json.<pid>.tmp links in ROOT/_tracealyze/fleet
    "index_table_links",  # index.json, runs/data.parquet, findings/ are links
    "forged_index",     # an index whose rows name the outside run, /etc, ../, a link
    "huge_index",       # 1M forged rows in runs/data.parquet
    "deep_tree",        # a DEPTH-deep folder chain in ROOT with a run.json at the bottom
    "non_utf8",         # a run folder in ROOT whose name is not UTF-8
    "json_only_run",    # a run in ROOT that is only a run.json marked completed
    "keep_raw",         # import-trace --keep-raw (copies into RUN/traces/)
    "allow_files",      # queries with --allow-files
)


@dataclass(frozen=True)
class Sql:
    text: str
    """With ``{pot}`` (the honeypot), ``{new}`` (a free path in base), ``{base}``."""
    kind: str
    """``write`` (refused: exit 2 whatever --allow-files says), ``outside`` (reads a file
    outside the runs: exit 2 without --allow-files), ``read``, ``baseline`` (a read that
    must work: exit 0 over a healthy run or a present index)."""


SQLS: tuple[Sql, ...] = (
    Sql("EXPLAIN ANALYZE COPY (SELECT 42 AS x) TO '{pot}' (FORMAT csv)", "write"),
    Sql("EXPLAIN ANALYZE COPY (SELECT 42 AS x) TO '{new}.csv'", "write"),
    Sql("EXPLAIN (FORMAT json) COPY (SELECT 1) TO '{pot}'", "write"),
    Sql("COPY (SELECT 42 AS x) TO '{pot}'", "write"),
    Sql("COPY steps TO '{new}.parquet' (FORMAT parquet)", "write"),
    Sql("/* a comment first */ COPY (SELECT 1) TO '{new}.txt'", "write"),
    Sql("SELECT 1; COPY (SELECT 1) TO '{pot}'", "write"),
    Sql("ATTACH '{new}.db' AS evil", "write"),
    Sql("EXPORT DATABASE '{new}_db'", "write"),
    Sql("INSTALL httpfs", "write"),
    Sql("LOAD httpfs", "write"),
    Sql("LOAD '{pot}'", "write"),
    Sql("PRAGMA profiling_output = '{pot}'", "write"),
    Sql("SET profiling_output = '{pot}'", "write"),
    Sql("CALL pragma_version()", "write"),
    Sql("SET enable_external_access = true", "write"),
    Sql("CREATE TABLE evil AS SELECT 1", "write"),
    Sql("SELECT * FROM read_text('{pot}')", "outside"),
    Sql("SELECT * FROM read_csv('{pot}')", "outside"),
    Sql("SELECT * FROM glob('{base}/*')", "outside"),
    Sql("SELECT count(*) FROM steps", "baseline"),
    Sql("WITH s AS (SELECT * FROM steps) SELECT max(step) FROM s", "read"),
    Sql("SELECT DISTINCT name FROM tensor_stats", "read"),
    Sql("SELECT * FROM events", "read"),
    Sql("SELECT * FROM runs", "read"),
    Sql("DESCRIBE steps", "read"),
    Sql("SUMMARIZE steps", "read"),
    Sql("SHOW TABLES", "read"),
    Sql("EXPLAIN ANALYZE SELECT count(*) FROM steps", "read"),
)


@dataclass(frozen=True)
class Spec:
    """What one case combines: hostile features, and the SQL (indexes into SQLS) its
    queries run."""

    features: frozenset[str]
    sqls: tuple[int, ...]

    def label(self) -> str:
        return f"[{','.join(sorted(self.features)) or 'plain'}] sql={list(self.sqls)}"


def draw_spec(rng: random.Random) -> Spec:
    """A case as the benchmark draws it: each feature with probability 1/3, 1-2 SQL."""
    return Spec(frozenset(f for f in FEATURES if rng.random() < 1 / 3),
                tuple(rng.sample(range(len(SQLS)), rng.randint(1, 2))))


@dataclass
class Case:
    spec: Spec
    base: Path
    root: Path
    run: Path
    other: Path
    outside: Path
    trace: Path

    def has(self, feature: str) -> bool:
        return feature in self.spec.features

    @property
    def pot(self) -> Path:
        return self.base / "honeypot"

    @property
    def here(self) -> Path:
        return self.base / "here"

    @property
    def declared(self) -> Path:
        return self.base / "declared"

    @property
    def healthy(self) -> bool:
        """RUN is a complete run whose files are all plain (links around it are fine)."""
        return not self.spec.features & {"bare_run", "run_json_link", "deep_in_run",
                                         "non_utf8_in_run"}

    def env(self) -> dict[str, str]:
        """HOME and the caches inside the case (caches are the only writes allowed there)."""
        return {"HOME": str(self.base / "home"), "XDG_CACHE_HOME": str(self.base / "cache"),
                "TRACEALYZE_CACHE_DIR": str(self.base / "cache" / "tracealyze")}


# ------------------------------------------------------------------------- building a case


def _links(folder: Path, names: list[str], target: Path) -> None:
    """Symbolic links ``folder/name`` -> ``target`` (the folder made, a name there replaced)."""
    folder.mkdir(parents=True, exist_ok=True)
    for n in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(folder / n)
        os.symlink(target, folder / n)


def _pids(pattern: str) -> list[str]:
    pid = os.getpid()
    return [pattern.format(pid=p) for p in range(pid - PID_SPAN, pid + PID_SPAN + 1)]


def safe_name(name: str) -> str:
    """./<run-name>.html as the report names it (DESIGN: the folder's name made safe)."""
    kept = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:100].lstrip(".")
    return f"{kept or 'report'}.html"


def chain(top: Path, depth: int = DEPTH, last: tuple[str, bytes] | None = None) -> None:
    """``top/d/d/.../d`` ``depth`` deep, made through descriptors (no path is rebuilt from
    its root at each level), with the file ``last`` (name, bytes) at the bottom."""
    top.mkdir(parents=True, exist_ok=True)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        if last is not None:
            out = os.open(last[0], os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
            os.write(out, last[1])
            os.close(out)
    finally:
        os.close(fd)


def _tables_of(run: Path) -> list[str]:
    return sorted(d.name for d in run.iterdir() if d.is_dir() and not d.is_symlink()
                  and any(d.glob("rank=*/part-*.parquet")))


def write_index(folder: Path, good: list[Path], forged: list[str]) -> None:
    """A well-formed fleet index at ``folder``: rows of the ``good`` runs (a stale
    fingerprint: re-analysed by fleet) and ``forged`` rows naming paths outside the root,
    their values SECRET."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tracealyze.analyzer.fleet.index import INDEX_FORMAT, SCHEMAS

    runs = [{"run_id": p.name, "path": str(p), "status": "completed", "fingerprint": "stale",
             "tables": _tables_of(p)} for p in good]
    runs += [{"run_id": SECRET, "path": p, "status": "completed", "top_finding": SECRET,
              "fingerprint": "forged", "tables": ["steps", "tensor_stats", "events"]}
             for p in forged]
    rows = {"runs": runs,
            "findings": [{"run_id": SECRET, "path": p, "order": 0, "id": "nonfinite",
                          "severity": "error", "title": SECRET} for p in forged],
            "ranks": [{"run_id": SECRET, "path": p, "rank": 0, "host": SECRET}
                      for p in forged]}
    for t, schema in SCHEMAS.items():
        (folder / t).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows.get(t, []), schema=schema),
                       folder / t / "data.parquet")
    (folder / "index.json").write_text(json.dumps(
        {"format": INDEX_FORMAT, "updated": time.time(), "runs": len(runs)}))


@lru_cache(maxsize=1)
def _huge_index_bytes(path: str) -> bytes:
    """1M rows of a few columns (117 KB once compressed): the forged index that took 4.7 GB
    and 342 s to decode before the index was read bounded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    col = pa.chunked_array([pa.array([path] * 1000)] * 1000)
    t = pa.table({"run_id": col, "path": col, "status": col})
    sink = pa.BufferOutputStream()
    pq.write_table(t, sink, compression="zstd")
    return bytes(sink.getvalue().to_pybytes())


def _trace(path: Path, trace_id: str | None) -> Path:
    doc: dict[str, object] = {"traceEvents": [
        {"ph": "X", "ts": 1, "dur": 5, "name": "aten::mm", "cat": "cpu_op", "pid": 1, "tid": 1},
        {"ph": "X", "ts": 2, "dur": 3, "name": "gemm_kernel", "cat": "kernel", "pid": 0,
         "tid": 7, "args": {"stream": 7, "correlation": 1}}]}
    if trace_id is not None:
        doc["trace_id"] = trace_id
    path.write_text(json.dumps(doc))
    return path


def build_case(base: Path, spec: Spec) -> Case:
    """Every file of the case ``spec`` under the empty folder ``base``."""
    has = spec.features.__contains__
    pot, honeydir = base / "honeypot", base / "honeydir"
    pot.write_bytes(b"honeypot: no command may change these bytes\n")
    honeydir.mkdir()
    (honeydir / "keep.txt").write_text("honeydir\n")
    write_run_json(honeydir, run_id="honeydir-run")  # what a run.json link resolves to
    for d in ("here", "home", "cache", "declared"):
        (base / d).mkdir()
    root = base / "fleet"
    outside = make_run(base, name="outside", steps=20, tensors=[f"{SECRET}.w"],
                       events=[{"kind": "user", "message": SECRET, "step": 1}],
                       run_meta={"run_id": SECRET})
    other = make_run(root, name="other", steps=40, tensors=2)
    name = HOSTILE_NAME if has("hostile_names") else "run"
    run_id = f"../../{pot}\n'; COPY (SELECT 42) TO '{pot}'; --{{}}\"" \
        if has("hostile_names") else "run"
    if has("bare_run"):
        (root / name).mkdir()
        write_run_json(root / name, run_id=run_id, status="completed")
        run = root / name
    else:
        run = make_run(root, name=name, steps=40, run_meta={"run_id": run_id},
                       tensors=["w'; COPY (SELECT 1) TO 'x' --", 'b"{}\n'] if has(
                           "hostile_names") else 2,
                       events=[{"kind": "x'\n{}", "message": f"'; COPY (SELECT 1) TO '{pot}'",
                                "step": 3}] if has("hostile_names") else ())
    trace = _trace(base / "trace.json", str(pot) if has("hostile_names") else None)
    case = Case(spec, base, root, run, other, outside, trace)
    _plant_around_run(case, honeydir)
    _plant_in_root(case)
    _plant_index(case, honeydir)
    return case


def _plant_around_run(case: Case, honeydir: Path) -> None:
    """Links where RUN's outputs might go (in RUN, the cwd, the -o folder) and junk in RUN."""
    run, pot = case.run, case.pot
    if case.has("run_links"):
        _links(run, ["report.html", "run.json.tmp", ".run.json.tmp",
                     *_pids(".report.html.{pid}.tmp"), *_pids("run.json.{pid}.tmp"),
                     *_pids(".run.json.{pid}.tmp")], pot)
        _links(run, ["traces"], honeydir)  # where import-trace --keep-raw copies traces
        _links(run / "trace_events", ["rank=0"], honeydir)  # where its parts go
    if case.has("run_json_link"):
        _links(run, ["run.json"], honeydir / "run.json")
    if case.has("cwd_link"):
        page = safe_name(run.name)
        _links(case.here, [page, *_pids(f".{page}.{{pid}}.tmp")], pot)
    if case.has("output_links"):
        _links(case.declared, ["report.html", "fleet.html", *_pids(
            ".report.html.{pid}.tmp")], pot)
        _links(case.declared, ["fleet-reports"], honeydir)
    part = next((case.other / "steps" / "rank=0").glob("part-*.parquet")).read_bytes()
    if case.has("deep_in_run"):
        chain(run / "junk", last=("part-000001.parquet", part))
    if case.has("non_utf8_in_run"):
        # a part named in Latin-1 among the run's parts, and a folder of that kind
        raw = os.fsencode(str(run))
        os.makedirs(raw + b"/steps/rank=0", exist_ok=True)
        os.mkdir(raw + b"/\xff")
        for rel in (b"/steps/rank=0/part-\xff\xfe.parquet", b"/\xff/part-000001.parquet"):
            with open(raw + rel, "wb") as f:
                f.write(part)


def _plant_in_root(case: Case) -> None:
    """Entries of the fleet root that discovery must skip (or take as a run of run.json)."""
    meta = (case.other / "run.json").read_bytes()
    if case.has("deep_tree"):
        chain(case.root / "deep", last=("run.json", meta))
    if case.has("non_utf8"):
        bad = os.fsencode(str(case.root)) + b"/\xff\xfe"
        os.mkdir(bad)
        with open(bad + b"/run.json", "wb") as f:
            f.write(meta)
    if case.has("json_only_run"):
        (case.root / "only-json").mkdir()
        write_run_json(case.root / "only-json", run_id="only-json", status="completed")


def _plant_index(case: Case, honeydir: Path) -> None:
    """The fleet index as a stranger leaves it: forged, huge, or links at its names."""
    root, pot = case.root, case.pot
    forged = [str(case.outside), "/etc", f"{root}/../outside", f"{root}/linked",
              f"{root}/other/../../outside"]
    index = root / "_tracealyze" / "fleet"
    if case.has("index_dir_link"):
        # the link leads to a tempting, well-formed index that names the outside run
        write_index(honeydir / "fleet", [case.run, case.other], forged)
        os.symlink(honeydir, root / "_tracealyze")
        return
    if case.has("forged_index"):
        os.symlink(case.outside, root / "linked")  # the row "ROOT/linked" goes through it
        write_index(index, [case.run, case.other], forged)
    if case.has("huge_index"):
        index.joinpath("runs").mkdir(parents=True, exist_ok=True)
        (index / "runs" / "data.parquet").write_bytes(_huge_index_bytes(str(case.outside)))
        if not (index / "index.json").exists():  # (an index.json that says "read me")
            from tracealyze.analyzer.fleet.index import INDEX_FORMAT

            (index / "index.json").write_text(json.dumps({"format": INDEX_FORMAT}))
    if case.has("index_lock_links"):
        _links(index, [".lock", *_pids(".index.json.{pid}.tmp"), *_pids(".lock.{pid}")], pot)
        _links(index / "runs", _pids(".data.parquet.{pid}.tmp"), pot)
    if case.has("index_table_links"):
        _links(index, ["index.json"], pot)
        _links(index / "runs", ["data.parquet"], pot)
        shutil.rmtree(index / "findings", ignore_errors=True)
        _links(index, ["findings"], honeydir)


