"""A classifier knocked back to guessing is not a rescaled objective (issue 45: "a loss at
chance level (ln K) ... is named as such"): one batch throws a model that had learned (loss
far under ln C) off; confidently wrong at first, it recalibrates to the uniform guess and
sits at ln C. A loss weight multiplies the level the model had by a factor with no reason to
land on ln C: still read as a rescale."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run

N, AT = 400, 170


def _structure(c: int) -> list[dict]:
    return [{"step": 0, "kind": "model_structure", "severity": "info", "subject": "model",
             "message": "structure", "details": (
                 '{"zero_by_construction": [], "not_called": [], '
                 f'"output_features": {c}, "bounded": {{}}}}')}]


def _learned(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    step = np.arange(N)
    loss = (0.004 + 2.3 * np.exp(-step / 30)) * np.exp(rng.normal(0, 0.5, N))
    grad = (0.08 + 3 * np.exp(-step / 30)) * np.exp(rng.normal(0, 0.8, N))
    return loss, grad


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("classes", [10, 4])
def test_a_model_knocked_to_chance_is_the_batch_not_a_rescale(tmp_path, seed, classes):
    rng = np.random.default_rng(seed)
    loss, grad = _learned(rng)
    chance = math.log(classes)
    after = np.arange(N - AT)
    # 100x its level at the batch, then confidently wrong, recalibrating to ln C
    loss[AT:] = (chance + 40 * np.exp(-after / 3)) * np.exp(rng.normal(0, 0.1, N - AT))
    loss[AT] = 3.0 * chance
    grad[AT:] = (2.0 + 60 * np.exp(-after / 3)) * np.exp(rng.normal(0, 0.6, N - AT))
    grad[AT] = 150.0
    run = make_run(tmp_path, steps=N, loss=loss, grad_norm=grad, events=_structure(classes))
    findings = build_summary(run)["findings"]
    assert not any("rescaled" in f["title"] for f in findings), [f["title"] for f in findings]
    above = [f for f in findings if f["severity"] != "info"]
    assert above and above[0]["first_step"] == AT, [(f["id"], f["first_step"]) for f in above]


@pytest.mark.parametrize("seed", range(4))
def test_a_loss_weight_x4_is_still_a_rescale(tmp_path, seed):
    """A ViT-like classifier at 1.0 (10 classes: ln C = 2.30) whose loss is summed over 4
    heads from step 170: 4.0, 1.7 ln C, and learning goes on."""
    rng = np.random.default_rng(40 + seed)
    step = np.arange(N)
    level = 0.9 + 1.4 * np.exp(-step / 60)
    loss = level * np.exp(rng.normal(0, 0.15, N))
    grad = (1.0 + level) * np.exp(rng.normal(0, 0.2, N))
    loss[AT:] *= 4
    grad[AT:] *= 4
    run = make_run(tmp_path, steps=N, loss=loss, grad_norm=grad, events=_structure(10))
    findings = build_summary(run)["findings"]
    assert any("rescaled" in f["title"] for f in findings), [f["title"] for f in findings]
    assert not [f for f in findings if f["severity"] != "info"], findings


@pytest.mark.parametrize("seed", range(3))
def test_a_rescale_scales_every_tensors_gradient_too(tmp_path, seed):
    """A regression's mean turned into a sum over a batch of 10 at step 150: the loss and
    every gradient ×10 at once (the gradient is linear in the loss: every tensor's by the same
    factor). Each tensor's gradient is judged on the new scale, as the total norm is: no
    gradient explosion."""
    rng = np.random.default_rng(70 + seed)
    step = np.arange(N)
    k = np.where(step >= 150, 10.0, 1.0)
    loss = (0.1 + np.exp(-step / 20)) * np.exp(rng.normal(0, 0.2, N)) * k
    grad = (0.4 + np.exp(-step / 20)) * np.exp(rng.normal(0, 0.3, N)) * k

    def norms(steps, name, kind):
        if kind != "grad":
            return None
        base = 0.1 * (1 + int(name.split(".")[1]))
        return base * np.exp(rng.normal(0, 0.3, len(steps))) * np.where(steps >= 150, 10, 1)

    run = make_run(tmp_path, steps=N, loss=loss, grad_norm=grad, tensors=4,
                   tensor_norm=norms)
    findings = build_summary(run)["findings"]
    assert any("rescaled" in f["title"] for f in findings), [f["title"] for f in findings]
    assert not [f for f in findings if f["severity"] != "info"], [
        (f["id"], f["severity"], f["title"]) for f in findings]
