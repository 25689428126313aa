"""The attacker's pass as a property (issue 42): whatever run directory, fleet root or SQL a
stranger hands the CLI, no command writes outside the output it declares, and each one ends
in time with exit 0 or 2 (2: one stderr line, never a traceback).

Hypothesis chooses which hostile features to combine (``tests/hostile.FEATURES``:
planted links at every name the analyzer might create, forged and huge fleet indexes,
folder chains 1,500 deep, names that are not UTF-8 or that hold quotes, newlines and SQL,
SQL that writes) and the kit builds them in a fresh folder per example and runs every
command over them in this process, with HOME, the caches and the working directory inside
that folder. ``benchmarks/hostile_inputs.py`` runs the same cases by the hundred.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.hostile import (
    FEATURES,
    SECRET,
    SQLS,
    Case,
    Command,
    Failure,
    Outcome,
    Spec,
    Tally,
    build_case,
    check,
    every_query,
    index_present,
    remove_tree,
    run_all,
    run_case,
)

TALLY = Tally()
"""(cases tried, cases clean) over this module's examples: printed when the module ends."""

SPECS = st.builds(
    Spec,
    features=st.frozensets(st.sampled_from(FEATURES)),
    sqls=st.lists(st.integers(0, len(SQLS) - 1), min_size=1, max_size=2, unique=True
                  ).map(tuple))


def _sql(start: str) -> int:
    return next(i for i, s in enumerate(SQLS) if s.text.startswith(start))


BASELINE = _sql("SELECT count(*) FROM steps")
EXPLAIN_COPY = _sql("EXPLAIN ANALYZE COPY (SELECT 42 AS x) TO '{pot}'")  # the repro
COPY = _sql("COPY (SELECT 42 AS x) TO '{pot}'")


@pytest.fixture(scope="module", autouse=True)
def _tally() -> Iterator[None]:
    yield
    print(f"\n{TALLY.line()}")


def _run(spec: Spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         work: Callable[[Case], list[Failure]] = run_case) -> list[Failure]:
    """Build ``spec`` in a fresh folder, ``work`` over it with HOME, the caches and the
    working directory inside it, and remove the folder."""
    base = Path(tempfile.mkdtemp(prefix="case-", dir=tmp_path))
    try:
        case = build_case(base, spec)
        with monkeypatch.context() as mp:
            for k, v in case.env().items():
                mp.setenv(k, v)
            mp.chdir(case.here)
            failures = work(case)
    finally:
        remove_tree(base)  # (a 1,500-deep chain: pytest's own cleanup would recurse)
    TALLY.add(failures)
    return failures


# No shrinking: an example takes seconds, shrinking one takes minutes, and a failure already
# names each command, the case's features and what broke (the benchmark lists them all).
@settings(max_examples=3, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate),
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(spec=Spec(frozenset(), (BASELINE,)))  # the plain case: every command works
@example(spec=Spec(frozenset({"run_links", "cwd_link", "report_into_run", "keep_raw",
                              "forged_index", "hostile_names"}), (EXPLAIN_COPY, BASELINE)))
@example(spec=Spec(frozenset({"index_dir_link", "deep_tree", "non_utf8", "json_only_run",
                              "output_links"}), (COPY, BASELINE)))
@given(spec=SPECS)
def test_no_command_writes_outside_its_outputs(spec: Spec, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    failures = _run(spec, tmp_path, monkeypatch)
    assert not failures, "\n".join(f.line() for f in failures)


def test_every_sql_over_a_run_and_a_forged_fleet(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Every statement of the list, with and without --allow-files where the flag could
    matter, over a run and over a fleet whose index names the outside run, /etc, ../ and a
    link (the property test draws only a few statements per example)."""
    ran: list[Outcome] = []

    def every(case: Case) -> list[Failure]:
        failures: list[Failure] = []
        ran.extend(run_all(case, every_query(case, index_present(case)), failures))
        return failures

    failures = _run(Spec(frozenset({"forged_index"}), ()), tmp_path, monkeypatch, every)
    assert len(ran) > len(SQLS) * 2  # (every statement ran, over a run and the fleet)
    assert not failures, "\n".join(f.line() for f in failures)


def test_the_checks_catch_each_kind_of_breach(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks are what make the property: a command that writes through the planted
    link, leaves a file, exits 1 with a traceback, prints SECRET and two lines for its exit
    2 is caught on each count (and a clean one on none)."""
    base = Path(tempfile.mkdtemp(prefix="case-", dir=tmp_path))
    try:
        case: Case = build_case(base, Spec(frozenset({"run_links"}), (BASELINE,)))
        monkeypatch.chdir(case.here)

        def evil(argv: list[str]) -> Outcome:
            with open(case.run / "report.html", "a") as f:  # the link to the honeypot
                f.write("pwned")
            (case.run / "left-behind.tmp").write_text("x")
            return Outcome(1, SECRET, "Traceback (most recent call last):\n  boom\n")

        def two_lines(argv: list[str]) -> Outcome:
            return Outcome(2, "", "warning: one\nError: two\n")

        cmd = Command("evil", ("summary", str(case.run)), ())
        _, broke = check(case, cmd, evil)
        text = "\n".join(broke)
        for word in ("honeypot", "created 'fleet/run/left-behind.tmp'", "exit 1",
                     "traceback", "SECRET"):
            assert word in text, text
        assert any("2 stderr lines" in b for b in check(case, cmd, two_lines)[1])
        strict = Command("strict", cmd.argv, (), frozenset({0}), say="skipped")
        assert any("expected [0]" in b for b in check(case, strict, two_lines)[1])
        assert check(case, strict, lambda a: Outcome(0, "", ""))[1] == [
            "exit 0 without saying 'skipped' on stderr"]

        def through_declared_link(argv: list[str]) -> Outcome:
            (case.run / "traces" / "copy.json").write_text("{}")  # traces/ -> honeydir
            return Outcome(0, "", "")

        # a declared folder covers what is under its name, not what a planted link reaches
        into_traces = Command("import", cmd.argv, ("fleet/run/traces/",))
        assert check(case, into_traces, through_declared_link)[1] == [
            "changed 'honeydir'", "created 'honeydir/copy.json'"]

        def declared_write(argv: list[str]) -> Outcome:
            (case.run / "left-behind.tmp").write_text("rewritten, as declared")
            return Outcome(0, "fine", "")

        declared = Command("ok", cmd.argv, ("fleet/run/left-behind.tmp",))
        assert check(case, declared, declared_write)[1] == []
    finally:
        remove_tree(base)
