"""loss_spike on converged losses: a jump is measured against what training has gained (the
loss's fall from its start), not only against the local level, which near zero makes every
hard batch look like a multiple of it. Series shaped like a real CNN run that gave a false
warning: the loss falls from ~1.6 to ~0.004, and single hard batches reach 0.016-0.022."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run

S = np.arange(300)


def _converged(seed: int) -> np.ndarray:
    """Exponential fall from 1.6 to a ~0.004 floor, with lognormal per-batch noise (8% early,
    15% once converged), on which a few hard batches stand out ~5x (set by the tests)."""
    rng = np.random.default_rng(seed)
    fall = np.exp(-S / 25)
    level = 0.004 + 1.6 * fall
    return level * np.exp(rng.normal(0, 1, len(S)) * (0.15 - 0.07 * fall))


def _spikes(run) -> list[dict]:
    return [f for f in build_summary(run)["findings"] if f["id"] == "loss_spike"]


@pytest.mark.parametrize("seed", range(4))
def test_hard_batches_on_a_converged_loss_are_not_spikes(tmp_path, seed):
    loss = _converged(seed)
    for s, v in ((180, 0.016), (222, 0.022), (265, 0.019)):  # ~4-5x the level, ~1% of the fall
        loss[s] = v
    assert _spikes(make_run(tmp_path, steps=300, loss=loss)) == []


@pytest.mark.parametrize("seed", range(4))
def test_a_jump_that_gives_back_a_share_of_the_fall_is_a_spike(tmp_path, seed):
    loss = _converged(seed)
    loss[222] = 0.5  # a third of what training gained, gone in one step
    (f,) = _spikes(make_run(tmp_path, steps=300, loss=loss))
    assert f["evidence"]["spike_steps"] == [222]


def test_a_loss_that_never_fell_keeps_the_relative_floor(tmp_path):
    """Fine-tuning from a converged checkpoint: nothing was gained in this run, so the jump
    is judged against the level alone (a 3x jump of a flat loss is a spike)."""
    rng = np.random.default_rng(0)
    loss = 0.3 * np.exp(rng.normal(0, 0.05, len(S)))
    loss[150] = 0.9
    (f,) = _spikes(make_run(tmp_path, steps=300, loss=loss))
    assert f["evidence"]["spike_steps"] == [150]
