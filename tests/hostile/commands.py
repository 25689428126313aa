"""Every CLI command over a case, and the checks each one must pass."""

from __future__ import annotations

import contextlib
import os
import stat
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .cases import (
    BOUND_S,
    DEPTH,
    FEATURES,
    SECRET,
    SQLS,
    Case,
    Spec,
    build_case,
    draw_spec,
    safe_name,
)
from .snapshots import Entry, changes, environment, remove_tree, snapshot

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
