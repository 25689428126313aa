"""A run that ends in an exception, and a process killed with SIGKILL."""

from __future__ import annotations

from pathlib import Path

import pytest
from tracealyze.analyzer.run.catalog import open_run

from tests.scenarios import checks
from tests.scenarios import scenarios as S


def test_exception_in_the_loop_is_a_crash_at_that_step(tmp_path: Path) -> None:
    run = S.run_crash(tmp_path / "run")
    code, summary = checks.cli_summary(run, "--fail-on", "critical")
    assert code == 1
    assert summary["run"]["status"] == "crashed"
    crash = checks.one(summary, "training_crashed")
    assert crash["severity"] == "critical"
    assert crash["subject"] == "SimulatedFailure"
    # steps 0..CRASH_STEP-1 were recorded; the exception was raised while step CRASH_STEP
    # was open
    assert crash["first_step"] == S.CRASH_STEP
    assert summary["run"]["steps"] == S.CRASH_STEP
    assert "simulated failure" in crash["message"]
    checks.assert_only(summary, run, {"training_crashed"})


@pytest.mark.slow
def test_sigkill_leaves_a_running_run_that_is_reported_killed(tmp_path: Path) -> None:
    run_dir = S.run_killed(tmp_path / "run")
    with open_run(run_dir) as run:
        assert run.status == "running"  # nobody got to say otherwise
        last = run.con.execute("SELECT max(step) FROM steps").fetchone()[0]
        # analysed right away, the heartbeat is fresh: it may still be running
        fresh = checks.one(checks.summarize(run_dir), "training_crashed")
        assert fresh["severity"] == "info"
        # the heartbeat limit is a threshold like any other: with a tiny one the silent
        # process is declared killed (in real use the default, minutes, applies)
        code, summary = checks.cli_summary(run_dir, "--set",
                                           "training_crashed.stale_after_s=0.001")
        assert code == 0  # no --fail-on: reporting is not failing
    killed = checks.one(summary, "training_crashed")
    assert killed["severity"] == "error"
    assert killed["subject"] == "rank 0"
    assert killed["first_step"] == last
    assert last + 1 >= 100  # the steps flushed before the kill are all readable
