"""Two ranks writing one run directory; one of them is slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenarios import checks
from tests.scenarios import scenarios as S


@pytest.mark.slow
def test_slow_rank_is_the_straggler(tmp_path: Path) -> None:
    run = S.run_straggler(tmp_path / "run")
    summary = checks.summarize(run)
    assert summary["run"]["ranks"] == [0, 1]
    assert summary["run"]["status"] == "completed"
    strag = checks.one(summary, "straggler")
    assert strag["subject"] == f"rank {S.STRAGGLER_RANK}"
    assert strag["severity"] in ("warning", "error")
    assert strag["first_step"] <= 10  # slow from the start
    checks.assert_only(summary, run, {"straggler"})
