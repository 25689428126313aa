"""Runs whose per-step gradient norms were spread by the norm budget (a CPU host where
reading them costs over 1% of the step): the analyzer must neither raise false alarms over
the gaps nor miss what the loss and the remaining norms show."""

from __future__ import annotations

from pathlib import Path

from tests.scenarios import checks
from tests.scenarios import scenarios as S


def strided_steps(run: Path) -> tuple[int, int]:
    from tracealyze.analyzer.run.catalog import open_run

    with open_run(run) as r:
        n, with_norm = r.con.execute(
            "SELECT count(*), count(grad_norm) FROM steps").fetchone()
    return n, with_norm


def test_healthy_run_with_spread_norms_has_nothing_above_info(tmp_path: Path) -> None:
    run = checks.record_isolated(S.run_strided_norms, tmp_path / "run")
    n, with_norm = strided_steps(run)
    assert n == 300 and with_norm <= 20  # the gaps are really there
    summary = checks.summarize(run)
    assert summary["run"]["status"] == "completed"
    checks.assert_only(summary, run)


def test_high_lr_with_spread_norms_still_finds_the_divergence(tmp_path: Path) -> None:
    run = checks.record_isolated(S.run_strided_norms, tmp_path / "run",
                                 scenario="run_high_lr")
    summary = checks.summarize(run)
    div = checks.one(summary, "loss_divergence")
    assert div["first_step"] >= S.LR_JUMP_STEP
    nonfinite = checks.one(summary, "nonfinite")
    assert nonfinite["first_step"] > S.LR_JUMP_STEP
    # nothing is dated in the healthy part of the run
    early = [f for f in checks.above(summary)
             if f["first_step"] is not None and f["first_step"] < S.LR_JUMP_STEP - 5]
    assert not early, checks.describe(summary)


def test_nan_in_module_with_spread_norms_names_the_module(tmp_path: Path) -> None:
    # The debug preset checks every module's output each step: the first NaN's module and
    # step come from there, not from the (spread) gradient norms.
    run = checks.record_isolated(S.run_strided_norms, tmp_path / "run",
                                 scenario="run_nan_in_module")
    summary = checks.summarize(run)
    nf = checks.one(summary, "nonfinite")
    assert nf["subject"] == S.NAN_MODULE and nf["first_step"] == S.NAN_STEP
