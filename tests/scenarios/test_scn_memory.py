"""Memory leaks of three kinds, each starting at LEAK_STEP, must be found on host memory:
malloc's bytes in use (heap_bytes, glibc), to the step, or RSS where there is no mallinfo2."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.scenarios import checks
from tests.scenarios import scenarios as S

HOST = ("heap_bytes", "rss_bytes")

LEAKS: dict[str, Callable[..., Path]] = {
    "tensor_list": S.run_leak_tensor_list,
    "loss_history_with_graphs": S.run_leak_loss_history,
    "cache_dict_by_step": S.run_leak_cache_dict,
}


@pytest.mark.parametrize("kind", sorted(LEAKS))
def test_leak_is_found_on_rss_from_its_start(kind: str, tmp_path: Path) -> None:
    run = checks.record_isolated(LEAKS[kind], tmp_path / kind)
    summary = checks.summarize(run)
    leak = checks.one(summary, "memory_leak")
    assert leak["subject"] in HOST
    assert leak["severity"] in ("error", "critical")
    if leak["subject"] == "heap_bytes":
        # live malloc'd bytes have no allocator lag: the leak is dated to the step (its
        # first tensors are kept after rec.step(LEAK_STEP), seen at the next commit)
        assert abs(leak["first_step"] - S.LEAK_STEP) <= 2, checks.describe(summary)
    else:
        # RSS, from window floors (~4 steps each) after a warm-up: the leak's start, not the
        # run's start or its end
        assert S.LEAK_STEP - 10 <= leak["first_step"] <= S.LEAK_STEP + 30, \
            checks.describe(summary)
    # Each leak keeps at least ~1 MiB per step alive; the slope must say so (not, e.g., the
    # recorder's own buffers).
    assert leak["evidence"]["slope_bytes_per_step"] >= 0.5 * S.LEAK_BYTES_PER_STEP
    checks.assert_only(summary, run, {"memory_leak"})


def test_leak_fails_the_ci_gate(tmp_path: Path) -> None:
    run = S.run_leak_cache_dict(tmp_path / "leak", steps=160)
    code, summary = checks.cli_summary(run, "--fail-on", "error")
    assert code == 1
    assert [f["subject"] in HOST for f in checks.by_id(summary, "memory_leak")] == [True]
