"""The attacker's pass (issue 42), as data: hostile run directories and fleet roots built on
disk, every CLI command run over them, and the checks each command must pass. Shared by
``tests/analyzer/test_trust_property.py`` (hypothesis picks the features) and
``benchmarks/hostile_inputs.py`` (a seeded random pick, hundreds of cases).

A case lives in one temporary folder ``base``::

    base/honeypot          a file no command may change (every planted link points here)
    base/honeydir/         a folder no command may write into (folder links point here)
    base/here/             the working directory (report RUN writes ./<run-name>.html)
    base/home/ base/cache/ HOME; XDG_CACHE_HOME and TRACEALYZE_CACHE_DIR (caches may land)
    base/declared/         where -o outputs go
    base/outside/          a run outside the fleet root, full of SECRET: never to be read
    base/fleet/            the fleet root: RUN, OTHER and the planted features

Each command is checked for: (a) nothing created, changed or removed under ``base`` except
its declared outputs (and the honeypot's bytes and mtime as they were), (b) exit 0 or 2,
(c) for 2 exactly one stderr line, and no traceback ever, (d) its wall time under
:data:`BOUND_S`, and (e) SECRET in none of its output nor its declared files. Where the
expected behaviour is known (a planted link at the output is refused; a write in SQL is
refused; a healthy run is read), the exit code itself is checked too.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import stat
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
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


# ------------------------------------------------------------------------- snapshots


Entry = tuple[int, int, bool, bool]
"""(size, mtime_ns, is_link, is_dir) of one entry, never following a link."""


def snapshot(base: Path) -> dict[str, Entry]:
    """Every entry under ``base`` by relative path (os.walk's listing, followlinks=False),
    walked through folder descriptors with a stack of our own: os.walk recurses on 3.11 (a
    DEPTH-deep chain raises), and a path rebuilt from ``base`` at each level costs DEPTH²
    name lookups."""
    out: dict[str, Entry] = {}
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    stack = [("", os.open(base, flags))]
    while stack:
        rel, fd = stack.pop()
        try:
            with os.scandir(fd) as it:
                for e in it:
                    r = f"{rel}/{e.name}" if rel else e.name
                    st = e.stat(follow_symlinks=False)
                    link, folder = stat.S_ISLNK(st.st_mode), stat.S_ISDIR(st.st_mode)
                    out[r] = (0 if folder else st.st_size, st.st_mtime_ns, link, folder)
                    if folder:
                        with contextlib.suppress(OSError):
                            stack.append((r, os.open(e.name, flags, dir_fd=fd)))
        finally:
            os.close(fd)
    return out


def allowed(rel: str, after: Entry | None, before: Entry | None,
            declared: tuple[str, ...]) -> bool:
    """Whether a change at ``rel`` is one of the command's declared outputs: a declared
    file, anything under a declared folder (``.../``), the caches, or a plain folder on the
    way to a declared output (made, or its mtime moved by the output's rename)."""
    for d in (*declared, "cache/"):
        if rel == d.rstrip("/") or (d.endswith("/") and rel.startswith(d)):
            return True
    on_the_way = any(d.startswith(rel + "/") for d in declared)
    plain_dir = [e is None or (e[3] and not e[2]) for e in (before, after)]
    return on_the_way and after is not None and all(plain_dir)


def changes(before: dict[str, Entry], after: dict[str, Entry],
            declared: tuple[str, ...]) -> list[str]:
    out = []
    for rel in sorted(set(before) | set(after)):
        b, a = before.get(rel), after.get(rel)
        if b != a and not allowed(rel, a, b, declared):
            what = "created" if b is None else "removed" if a is None else "changed"
            out.append(f"{what} {rel!a}")
    return out


def remove_tree(path: Path) -> None:
    """``rm -rf path`` without recursion and in linear time (shutil.rmtree recurses on 3.11:
    a DEPTH-deep chain raises RecursionError): one folder descriptor open at a time, going
    down by name and back up through ``..``."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    fd, names = os.open(path, flags), []
    while True:
        sub = None
        with os.scandir(fd) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    sub = e.name
                    break
                os.unlink(e.name, dir_fd=fd)
        if sub is not None:
            nxt = os.open(sub, flags, dir_fd=fd)
            names.append(sub)
        elif names:
            nxt = os.open("..", flags, dir_fd=fd)
            os.rmdir(names.pop(), dir_fd=nxt)
        else:
            os.close(fd)
            break
        os.close(fd)
        fd = nxt
    os.rmdir(path)


@contextlib.contextmanager
def environment(case: Case) -> Iterator[None]:
    """The case's HOME and caches set, and its ``here`` the working directory (for callers
    without pytest's monkeypatch)."""
    old_env = {k: os.environ.get(k) for k in case.env()}
    old_cwd = os.getcwd()
    os.environ.update(case.env())
    os.chdir(case.here)
    try:
        yield
    finally:
        os.chdir(old_cwd)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ------------------------------------------------------------------------- commands and checks

ZERO, TWO, EITHER = frozenset({0}), frozenset({2}), frozenset({0, 2})


@dataclass(frozen=True)
class Command:
    label: str
    argv: tuple[str, ...]
    declared: tuple[str, ...]
    """What it may create or change, relative to base (``.../``: all under a folder)."""
    expect: frozenset[int] = EITHER
    say: str | None = None
    """A word its stderr must hold when it exits 0 (a skipped entry is said, not hidden)."""


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    error: str | None = None
    """An exception the CLI let through, formatted (CliRunner catches it: exit 1)."""


@dataclass(frozen=True)
class Failure:
    command: str
    features: str
    what: str

    def line(self) -> str:
        return f"{self.command} | {self.features} | {self.what}"


@dataclass
class Tally:
    tried: int = 0
    clean: int = 0
    failures: list[Failure] = field(default_factory=list)

    def add(self, failures: list[Failure]) -> None:
        self.tried += 1
        self.clean += not failures
        self.failures += failures

    def line(self) -> str:
        return f"hostile inputs: {self.tried} tried, {self.clean} clean"


Invoke = Callable[[list[str]], Outcome]


def cli_invoke(argv: list[str]) -> Outcome:
    """``tracealyze ARGV`` in this process (click's CliRunner: stdout and stderr apart)."""
    from click.testing import CliRunner
    from tracealyze.analyzer.cli import main

    res = CliRunner().invoke(main, argv)
    error = None
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        error = "".join(traceback.format_exception(res.exception)[-3:])
    return Outcome(res.exit_code, res.stdout, res.stderr, error)


def _rel(case: Case, p: Path) -> str:
    return os.path.relpath(p, case.base)


def _query(case: Case, i: int, fleet: bool, allow: bool, index_present: bool) -> Command:
    """``query RUN SQLS[i]`` (or ``query --fleet ROOT``), and the exit it must give."""
    sql = SQLS[i]
    text = sql.text.format(pot=case.pot, new=case.base / "pwned", base=case.base)
    if sql.kind == "write" or (sql.kind == "outside" and not allow) or (
            fleet and case.has("index_dir_link")):
        expect = TWO
    elif sql.kind == "baseline" and case.healthy and (index_present or not fleet):
        expect = ZERO
    else:
        expect = EITHER
    where = ("--fleet", str(case.root)) if fleet else (str(case.run),)
    return Command(f"query {'--fleet ROOT' if fleet else 'RUN'} SQLS[{i}]"
                   f"{' --allow-files' if allow else ''}",
                   ("query", *where, text, *(("--allow-files",) if allow else ())), (), expect)


def _queries(case: Case, fleet: bool, index_present: bool = False) -> Iterator[Command]:
    for i in case.spec.sqls:
        yield _query(case, i, fleet, case.has("allow_files"), index_present)


def every_query(case: Case, index_present: bool) -> Iterator[Command]:
    """Each SQL of the list over RUN and over ``--fleet ROOT``, with ``--allow-files`` too
    where the flag could matter (a write must stay refused; an outside read is let in)."""
    for i, sql in enumerate(SQLS):
        for fleet in (False, True):
            for allow in (False, True) if sql.kind in ("write", "outside") else (False,):
                yield _query(case, i, fleet, allow, index_present)


def run_commands(case: Case) -> Iterator[Command]:
    """The commands that read RUN (and OTHER), and report's two outputs."""
    run, ok = str(case.run), ZERO if case.healthy else EITHER
    yield Command("summary RUN", ("summary", run), (), ok)
    yield Command("summary RUN --json", ("summary", run, "--json"), (), ok)
    yield Command("tables RUN", ("tables", run), (), ok)
    yield from _queries(case, fleet=False)
    yield Command("compare RUN OTHER", ("compare", run, str(case.other)), (), ok)
    page = case.here / safe_name(case.run.name)
    yield Command("report RUN", ("report", run), (_rel(case, page),),
                  TWO if case.has("cwd_link") else ok)
    into = case.has("report_into_run")
    out = case.run / "report.html" if into else case.declared / "report.html"
    linked = case.has("run_links") if into else case.has("output_links")
    yield Command(f"report RUN -o {'RUN' if into else 'DECLARED'}/report.html",
                  ("report", run, "-o", str(out)), (_rel(case, out),), TWO if linked else ok)


def fleet_commands(case: Case) -> Iterator[Command]:
    """fleet ROOT, --json, and -o with --reports: the index (unless ``_tracealyze`` is a
    planted link), the page and its reports folder are theirs to write."""
    root = str(case.root)
    index = () if case.has("index_dir_link") else (
        _rel(case, case.root / "_tracealyze" / "fleet") + "/",)
    expect = TWO if case.has("index_dir_link") else EITHER if case.spec.features & {
        "index_lock_links", "index_table_links"} else ZERO
    say = "skipped" if case.spec.features & {"deep_tree", "non_utf8"} else None
    # -j 1: the analyses in this process, under this case's HOME and cwd (a forkserver
    # started by an earlier case would keep that case's environment)
    yield Command("fleet ROOT", ("fleet", root, "-j", "1"), index, expect, say)
    yield Command("fleet ROOT --json", ("fleet", root, "-j", "1", "--json"), index, expect,
                  say)
    page = case.declared / "fleet.html"
    yield Command("fleet ROOT -o DECLARED/fleet.html --reports",
                  ("fleet", root, "-j", "1", "-o", str(page), "--reports"),
                  (*index, _rel(case, page), _rel(case, case.declared / "fleet-reports") + "/"),
                  TWO if case.has("output_links") else expect, say)


def fleet_queries(case: Case, index_present: bool) -> Iterator[Command]:
    """query --fleet ROOT with the case's SQL (``index_present``: an index is there)."""
    yield from _queries(case, fleet=True, index_present=index_present)


def import_commands(case: Case) -> Iterator[Command]:
    """import-trace into RUN: its trace_events/, traces/ and run.json are its outputs."""
    run = str(case.run)
    raw = ("--keep-raw",) if case.has("keep_raw") else ()
    plain = case.healthy and not case.has("run_links")
    yield Command(f"import-trace TRACE RUN{' --keep-raw' if raw else ''}",
                  ("import-trace", str(case.trace), run, "-q", *raw),
                  (_rel(case, case.run / "trace_events") + "/",
                   _rel(case, case.run / "traces") + "/", _rel(case, case.run / "run.json")),
                  ZERO if plain else EITHER)


def _secret_in(case: Case, before: dict[str, Entry], after: dict[str, Entry],
               declared: tuple[str, ...]) -> list[str]:
    """Declared outputs written by the command that hold SECRET."""
    hits = []
    for rel, e in after.items():
        if e != before.get(rel) and not e[2] and not e[3] and e[0] < 64 << 20 and any(
                rel == d or (d.endswith("/") and rel.startswith(d)) for d in declared):
            with contextlib.suppress(OSError):
                if SECRET.encode() in (case.base / rel).read_bytes():
                    hits.append(f"SECRET in its output file {rel!a}")
    return hits


def _pot(case: Case) -> tuple[bytes, int] | None:
    """The honeypot's bytes and mtime (None: it is gone, or no longer a file)."""
    try:
        st = os.stat(case.pot, follow_symlinks=False)
        return (case.pot.read_bytes(), st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None
    except OSError:
        return None


def check(case: Case, cmd: Command, invoke: Invoke = cli_invoke) -> tuple[Outcome, list[str]]:
    """Run ``cmd`` and say every way it broke the properties (none: it is clean)."""
    pot_before = _pot(case)
    before = snapshot(case.base)
    t0 = time.monotonic()
    out = invoke(list(cmd.argv))
    took = time.monotonic() - t0
    after = snapshot(case.base)
    broke = []
    if _pot(case) != pot_before:
        broke.append("the honeypot was written through a link (or replaced)")
    broke += changes(before, after, cmd.declared)
    if out.error is not None:
        broke.append("uncaught " + " / ".join(out.error.strip().splitlines()[-3:]))
    elif out.code not in (0, 2):
        broke.append(f"exit {out.code}")
    elif out.code not in cmd.expect:
        broke.append(f"exit {out.code}, expected {sorted(cmd.expect)} (stderr: "
                     f"{out.stderr.strip()[-300:]!a})")
    if out.code == 0 and cmd.say is not None and cmd.say not in out.stderr:
        broke.append(f"exit 0 without saying {cmd.say!r} on stderr")
    lines = out.stderr.strip().splitlines()
    if out.code == 2 and len(lines) != 1:
        broke.append(f"exit 2 with {len(lines)} stderr lines: {out.stderr[-400:]!a}")
    if "Traceback" in out.stdout + out.stderr:
        broke.append("a traceback in its output")
    if took > BOUND_S:
        broke.append(f"took {took:.1f} s (bound {BOUND_S:.0f} s)")
    if SECRET in out.stdout + out.stderr:
        broke.append("SECRET in its output: it read the outside run or a forged index row")
    broke += _secret_in(case, before, after, cmd.declared)
    return out, broke


def run_all(case: Case, cmds: Iterator[Command], failures: list[Failure],
            invoke: Invoke = cli_invoke) -> list[Outcome]:
    """Check each of ``cmds`` in turn, adding what broke to ``failures``."""
    outs = []
    for cmd in cmds:
        out, broke = check(case, cmd, invoke)
        failures.extend(Failure(cmd.label, case.spec.label(), b) for b in broke)
        outs.append(out)
    return outs


def index_present(case: Case) -> bool:
    """Whether the case starts with a fleet index that query --fleet must read."""
    return case.has("forged_index") and not case.spec.features & {
        "index_dir_link", "index_table_links", "huge_index"}


def run_case(case: Case, invoke: Invoke = cli_invoke) -> list[Failure]:
    """Every command over the case, in an order where each one's state is known: the
    queries of a forged index run before ``fleet`` rewrites it, ``import-trace`` last."""
    failures: list[Failure] = []

    def each(cmds: Iterator[Command]) -> list[Outcome]:
        return run_all(case, cmds, failures, invoke)

    each(run_commands(case))
    present = index_present(case)
    each(fleet_queries(case, present))
    built = any(o.code == 0 for o in each(fleet_commands(case)))
    each(fleet_queries(case, present or built))
    if any(o.code == 0 for o in each(import_commands(case))) and case.healthy:
        each(iter([Command("summary RUN (traces imported)", ("summary", str(case.run)), (),
                           ZERO)]))
    return failures


__all__ = ["DEPTH", "FEATURES", "SECRET", "SQLS", "Case", "Command", "Failure", "Outcome",
           "Spec", "Tally", "build_case", "changes", "check", "cli_invoke", "draw_spec",
           "environment", "every_query", "index_present", "remove_tree", "run_all",
           "run_case", "snapshot"]
