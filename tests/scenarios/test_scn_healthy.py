"""Healthy controls: several seeds and architectures must give nothing above info."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenarios import checks
from tests.scenarios import scenarios as S

# (Real architectures' healthy runs, with and without clipping, are in tests/matrix.)
CONTROLS = [("mlp", 0), ("mlp", 1), ("conv", 0), ("transformer", 0)]


@pytest.mark.parametrize(("arch", "seed"), CONTROLS)
def test_healthy_run_has_nothing_above_info(arch: str, seed: int, tmp_path: Path) -> None:
    run = checks.record_isolated(S.run_healthy, tmp_path / f"{arch}{seed}", arch=arch,
                                 seed=seed)
    summary = checks.summarize(run)
    assert summary["run"]["status"] == "completed"
    assert summary["run"]["steps"] == 300
    checks.assert_only(summary, run)


def test_healthy_sgd_regression_with_a_large_stable_lr(tmp_path: Path) -> None:
    """The high-LR scenario's model with a 10x (not 80x) jump: gradient norms are noisy
    (bias gradients near convergence jump 10x from step to step) but nothing grows."""
    run = checks.record_isolated(S.run_high_lr, tmp_path / "run", jump=10.0, hidden=S.HIDDEN,
                                 batch_size=512, steps=250)
    summary = checks.summarize(run)
    checks.assert_only(summary, run)


def test_healthy_standard_preset_with_profiler_window(tmp_path: Path) -> None:
    """The production preset as shipped (profiler window at step 50)."""
    run = checks.record_isolated(S.run_healthy, tmp_path / "run", profile_start=50)
    summary = checks.summarize(run)
    assert list((Path(run) / "traces" / "rank=0").glob("*.pt.trace.json.gz"))
    checks.assert_only(summary, run)


def test_healthy_debug_preset(tmp_path: Path) -> None:
    """Debug preset: activation stats, update ratios, NaN tracing all on."""
    run = checks.record_isolated(S.run_healthy, tmp_path / "run", preset="debug",
                                 profile_start=0, profile_every=0)
    summary = checks.summarize(run)
    checks.assert_only(summary, run)
