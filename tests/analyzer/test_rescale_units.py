"""A loss and gradient norm that jump together at one step and stay are a rescaled objective
only when every tensor's gradient moved by the one factor (the gradient is linear in the
loss). Targets in new units, inputs no longer normalised, weights reloaded at another scale
move each tensor's gradient by its own factor: the training's problem, found at its step."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run

N, AT = 360, 200


def _run(tmp_path, seed: int, per_tensor: bool):
    rng = np.random.default_rng(900 + seed)
    step = np.arange(N)
    # a regression whose targets are ×1000 from AT: the squared error ×~10^6, the total
    # gradient norm ×~10^3, and there it stays (the model cannot catch up)
    level = 0.1 + np.exp(-step / 40)
    loss = level * np.exp(rng.normal(0, 0.15, N)) * np.where(step >= AT, 1e6, 1)
    grad = (0.5 + level) * np.exp(rng.normal(0, 0.25, N)) * np.where(step >= AT, 1e3, 1)
    ups = np.exp(rng.uniform(np.log(30), np.log(3e4), 8))  # each tensor its own factor

    def norms(steps, name, kind):
        if kind != "grad":
            return None
        i = int(name.split(".")[1]) * 2 + name.endswith("bias")
        up = ups[i] if per_tensor else 1e3
        return 0.05 * (1 + i) * np.exp(rng.normal(0, 0.25, len(steps))) * np.where(
            steps >= AT, up, 1)

    return make_run(tmp_path, steps=N, loss=loss, grad_norm=grad, tensors=8,
                    tensor_norm=norms)


@pytest.mark.parametrize("seed", range(3))
def test_targets_in_new_units_are_not_a_rescaled_objective(tmp_path, seed):
    findings = build_summary(_run(tmp_path, seed, per_tensor=True))["findings"]
    assert not any("rescaled" in f["title"] for f in findings), [f["title"] for f in findings]
    above = [f for f in findings if f["severity"] != "info"]
    assert any(f["id"] == "gradient_explosion" and f["first_step"] == AT for f in above), [
        (f["id"], f["first_step"]) for f in above]


@pytest.mark.parametrize("seed", range(3))
def test_the_same_jump_with_every_gradient_x1000_is_one(tmp_path, seed):
    findings = build_summary(_run(tmp_path, seed, per_tensor=False))["findings"]
    assert any("rescaled" in f["title"] for f in findings), [f["title"] for f in findings]
    assert not [f for f in findings if f["severity"] != "info"], [
        (f["id"], f["severity"], f["title"]) for f in findings]
