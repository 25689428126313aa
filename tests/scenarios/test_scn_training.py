"""Loss shape and optimizer pathologies: frozen optimizer, a loss spike."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.scenarios import checks
from tests.scenarios import scenarios as S

FROZEN: dict[str, Callable[..., Path]] = {
    "lr_zero": S.run_frozen_lr0,
    "optimizer_over_stale_params": S.run_frozen_stale_params,
}


@pytest.mark.parametrize("kind", sorted(FROZEN))
def test_frozen_optimizer_gives_plateau_and_zero_updates(kind: str, tmp_path: Path) -> None:
    # debug preset: update ratios are recorded (every 10 steps)
    run = FROZEN[kind](tmp_path / kind, preset="debug")
    summary = checks.summarize(run)
    plateau = checks.one(summary, "loss_plateau")
    assert plateau["severity"] == "warning"  # never learned, not a late convergence
    assert plateau["first_step"] <= 20
    upd = checks.one(summary, "update_ratio")
    assert upd["severity"] in ("warning", "error")
    assert upd["subject"] in {n for n, _ in S.mlp().named_parameters()}
    expected = {"loss_plateau", "update_ratio"}
    if kind == "optimizer_over_stale_params":
        # the model's parameters are in no param group and never move: the root cause
        cov = checks.one(summary, "optimizer_coverage")
        assert cov["severity"] == "error" and summary["findings"][0]["id"] == cov["id"]
        expected.add("optimizer_coverage")
    checks.assert_only(summary, run, expected)


def test_frozen_optimizer_standard_preset_plateau(tmp_path: Path) -> None:
    run = S.run_frozen_lr0(tmp_path / "run")
    summary = checks.summarize(run)
    assert checks.one(summary, "loss_plateau")["severity"] == "warning"
    checks.assert_only(summary, run, {"loss_plateau"})


def test_loss_spike_at_the_corrupted_batch(tmp_path: Path) -> None:
    run = S.run_loss_spike(tmp_path / "run")
    summary = checks.summarize(run)
    spike = checks.one(summary, "loss_spike")
    assert spike["first_step"] == S.SPIKE_STEPS[0]
    assert spike["evidence"]["spike_steps"] == list(S.SPIKE_STEPS)
    checks.assert_only(summary, run, {"loss_spike"})
