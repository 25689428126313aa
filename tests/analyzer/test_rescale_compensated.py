"""A rescale the loop compensates (issue 45, item 2): ``reduction="sum"`` instead of
``"mean"`` with the learning rate divided by the batch size, or a loss x8 with the LR / 8,
multiplies the loss and every gradient by k at one step and the LR by 1/k at the same step:
the updates are what they were. An LR that fell there cannot have raised the loss, so the
rise is the objective's, reported at info; an LR that rose at that step still explains the
rise (an LR jump), and the run is judged on it."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run

N = 400
AT = 220


def _series(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    s = np.arange(N)
    level = 0.3 + 1.5 * np.exp(-s / 90)
    loss = level * np.exp(rng.normal(0, 0.08, N))
    grad = (0.4 + level) * np.exp(rng.normal(0, 0.12, N))
    return loss, grad


def _above_info(tmp_path, loss, grad, lr):
    run = make_run(tmp_path, steps=N, loss=loss, grad_norm=grad, lr=lr)
    s = build_summary(run)
    return [f["id"] for f in s["findings"] if f["severity"] != "info"], s["findings"]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [8.0, 64.0])
def test_a_rescale_with_the_lr_divided_by_its_factor_is_the_objectives(tmp_path, seed, k):
    rng = np.random.default_rng(seed)
    loss, grad = _series(rng)
    loss[AT:] *= k
    grad[AT:] *= k
    lr = np.where(np.arange(N) < AT, 0.05, 0.05 / k)
    above, findings = _above_info(tmp_path, loss, grad, lr)
    assert above == [], findings
    assert any("rescaled" in f["title"] and f["first_step"] == AT for f in findings), findings


@pytest.mark.parametrize("seed", range(3))
def test_an_lr_that_rose_at_the_rise_still_explains_it(tmp_path, seed):
    """The LR x8 at the step the loss and gradients rise x8: not read as a rescale."""
    rng = np.random.default_rng(20 + seed)
    loss, grad = _series(rng)
    loss[AT:] *= 8.0
    grad[AT:] *= 8.0
    lr = np.where(np.arange(N) < AT, 0.05, 0.4)
    _, findings = _above_info(tmp_path, loss, grad, lr)
    assert not any("rescaled" in f["title"] for f in findings), findings
