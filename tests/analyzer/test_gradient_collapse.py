"""Every layer's gradient collapsing at once while the loss stays (issue 45, held-out
ah_vgg_bn: a loss divided by its scale instead of multiplied after a resume, gradients
×1e-6 from step 200). The per-layer rule compares layers with each other and saw nothing;
the explosion-at-start rule read the first gradient against the collapsed level and called
step 0 an explosion. A model that converges, whose loss falls with its gradient, and a
gradient that came back down after a spike, are not a collapse."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run

N = 400
NAMES = ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc.weight", "fc.bias"]


def _findings(tmp_path, loss: np.ndarray, grad: np.ndarray, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed + 100)
    scale = grad / np.median(grad[:50])

    def norm(steps, name, kind):
        if kind != "grad":
            return None
        # every layer moves with the total norm (they all fall together)
        return 0.05 * scale[np.asarray(steps)] * np.exp(rng.normal(0, 0.2, len(steps)))

    run = make_run(tmp_path, steps=N, loss=loss, grad_norm=grad, tensors=NAMES,
                   tensor_norm=norm)
    return build_summary(run)["findings"]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("at, fall", [(200, 1e6), (120, 1e4), (280, 3e3)])
def test_every_gradient_collapsing_at_a_step_is_found_there(tmp_path, seed, at, fall):
    rng = np.random.default_rng(seed)
    s = np.arange(N)
    loss = (0.5 + 1.5 * np.exp(-s / 40)) * np.exp(rng.normal(0, 0.05, N))
    loss[at:] = loss[at - 1] * np.exp(rng.normal(0, 0.01, N - at))  # frozen
    grad = 2.5 * np.exp(rng.normal(0, 0.3, N))
    grad[at:] /= fall
    fs = _findings(tmp_path, loss, grad, seed)
    (f,) = [x for x in fs if x["id"] == "vanishing_gradient" and x["severity"] != "info"]
    assert f["severity"] == "error" and f["first_step"] == at
    assert f["evidence"]["collapse"] is True
    # and the first step was no explosion: it sat at the level the run held for `at` steps
    assert not [x for x in fs if x["id"] == "gradient_explosion"]


@pytest.mark.parametrize("seed", range(3))
def test_a_model_whose_loss_falls_with_its_gradient_converged(tmp_path, seed):
    # fits its data: loss 2.3 -> 1e-5, gradient 3 -> 1e-3 (the loss falls further)
    rng = np.random.default_rng(seed)
    s = np.arange(N)
    loss = 2.3 * np.exp(-s / 30) + 1e-5
    grad = 3.0 * np.exp(-s / 45) + 1e-3
    fs = _findings(tmp_path, loss * np.exp(rng.normal(0, 0.05, N)),
                   grad * np.exp(rng.normal(0, 0.2, N)), seed)
    assert not [x for x in fs if x["id"] == "vanishing_gradient" and x["severity"] != "info"]


@pytest.mark.parametrize("seed", range(3))
def test_a_gradient_back_down_after_a_burst_is_not_a_collapse(tmp_path, seed):
    # a burst of 40 steps at 1e4x, then the run's own level again
    rng = np.random.default_rng(seed)
    loss = 1.0 * np.exp(rng.normal(0, 0.05, N))
    grad = 0.5 * np.exp(rng.normal(0, 0.3, N))
    grad[150:190] *= 1e4
    fs = _findings(tmp_path, loss, grad, seed)
    assert not [x for x in fs if x["id"] == "vanishing_gradient"
                and x["evidence"].get("collapse")]
