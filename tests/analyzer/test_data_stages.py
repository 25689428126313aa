"""A new stage of the data explains the jump that starts on it (#45, item 2: curricula).

The recorder counts the batches of a new input shape per step (steps.new_shapes). In a run
where those are rare, a loss jump that begins at one (a length curriculum's longer
sequences: the loss x50, every gradient x20, then re-learned) is the data changing, not an
accident: loss_spike says so at info, the gradient's rise there is the new data's while it
settles, and the jump is no rescaled objective. The same jumps without the shapes, or with
new shapes on every tenth step, stay what they were; a stage that sets off a real blow-up
is still an explosion."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run

N = 500
STEPS = np.arange(N)
STAGES = (200, 350)


def _run(tmp_path, seed: int, shapes: str = "stages", blowup: bool = False):
    rng = np.random.default_rng(seed)
    s = STEPS
    loss = (0.002 + 0.6 * np.exp(-s / 25)) * np.exp(rng.normal(0, 0.15, N))
    grad = 0.1 * np.exp(rng.normal(0, 0.2, N))
    for st in STAGES:
        after = np.clip(s - st, 0, None)
        loss = loss * (1 + np.where(s >= st, 50 * np.exp(-after / 12.0), 0.0))
        grad = grad * (1 + np.where(s >= st, 20 * np.exp(-after / 10.0), 0.0))
    if blowup:  # the last stage sets off a geometric growth into NaN
        grow = np.where(s >= STAGES[1], np.exp(0.25 * (s - STAGES[1])), 1.0)
        grad = grad * grow
        loss = loss * np.where(s >= STAGES[1], np.sqrt(grow), 1.0)
        grad[grad > 1e8] = np.nan
        loss[grad != grad] = np.nan
    new = np.zeros(N)
    new[0] = 1
    if shapes == "stages":
        new[list(STAGES)] = 1
    elif shapes == "often":  # every tenth step a new shape (dynamic padding)
        new[::10] = 1
    return make_run(tmp_path, steps=N, loss=loss, grad_norm=grad, lr=3e-3,
                    new_shapes=None if shapes == "none" else new)


def _above_info(run) -> list[dict]:
    return [f for f in build_summary(run)["findings"] if f["severity"] != "info"]


@pytest.mark.parametrize("seed", range(4))
def test_jumps_at_new_stages_of_the_data_are_explained(tmp_path, seed):
    summary = build_summary(_run(tmp_path, seed))
    assert [f for f in summary["findings"] if f["severity"] != "info"] == []
    (spike,) = [f for f in summary["findings"] if f["id"] == "loss_spike"]
    assert [s["step"] for s in spike["evidence"]["stages"]] == list(STAGES)
    assert not any("rescaled" in f["title"] for f in summary["findings"])


@pytest.mark.parametrize("shapes", ["none", "often"])
def test_without_rare_new_shapes_the_jumps_are_not_explained(tmp_path, shapes):
    ids = {f["id"] for f in _above_info(_run(tmp_path, 0, shapes))}
    assert ids & {"loss_spike", "gradient_explosion", "loss_divergence"}, ids


def test_a_stage_that_sets_off_a_blowup_is_an_explosion(tmp_path):
    found = {f["id"]: f for f in _above_info(_run(tmp_path, 0, blowup=True))}
    assert "gradient_explosion" in found and found["gradient_explosion"]["severity"] == "error"
