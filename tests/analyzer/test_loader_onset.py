"""When an input bottleneck began (issue 45, item 1): dataloader_bottleneck is dated where
the waiting that makes the finding starts — the first hiccup of a loader that stalls 1-2 s
now and then, the step a loader fell behind — not at an ordinary step of a loader that
keeps up but for a quarter of noise (a held-out PointNet run was dated 41 steps early)."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run

N = 400


def _finding(tmp_path, dur, wait):
    run = make_run(tmp_path, steps=N, duration=dur, data_wait=wait)
    hits = [f for f in build_summary(run)["findings"] if f["id"] == "dataloader_bottleneck"]
    return hits[0] if hits else None


@pytest.mark.parametrize("seed", range(5))
def test_hiccups_are_dated_at_the_first(tmp_path, seed):
    """A loader whose ordinary steps wait 15-40% of a 30 ms step (2 workers, barely
    keeping up) and that stalls 1-2 s at 12 random steps from step 100."""
    rng = np.random.default_rng(seed)
    compute = 0.022 * np.exp(rng.normal(0, 0.15, N))
    wait = compute * rng.uniform(0.18, 0.65, N)
    at = np.sort(rng.choice(np.arange(100, N - 5), 12, replace=False))
    wait[at] = rng.uniform(1.0, 2.0, len(at))
    f = _finding(tmp_path, compute + wait, wait)
    assert f is not None and f["severity"] in ("warning", "error"), f
    assert f["first_step"] == int(at[0]), (f["first_step"], at[:3])


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("onset", [0, 180, 300])
def test_a_loader_that_falls_behind_is_dated_where_it_did(tmp_path, seed, onset):
    """Waits of ~5% of the step until ``onset``, ~70% from it (a dataset moved to slow
    storage), at step 0 too (dated after the warm-up), and in the last quarter (later, the
    run as a whole no longer waits a quarter of its time: no finding)."""
    rng = np.random.default_rng(20 + seed)
    compute = 0.03 * np.exp(rng.normal(0, 0.1, N))
    wait = compute * rng.uniform(0.02, 0.08, N)
    wait[onset:] = compute[onset:] * rng.uniform(2.0, 2.6, N - onset)
    f = _finding(tmp_path, compute + wait, wait)
    assert f is not None and f["severity"] in ("warning", "error"), f
    assert abs(f["first_step"] - max(onset, 3)) <= 1, f["first_step"]
