"""The recorded loss changes scale while the gradients do not (#45: "a loss ×k"; stats/shift
LOGGED_MIN): a manual static loss scale whose scaled loss is logged, percent instead of a
fraction. What the optimizer follows did not change, so training did not get worse: the
change is said at info and what follows is judged on the new scale. A loss that really
rises with its gradients, or one raised by a learning-rate jump, is still a divergence."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run

N, AT = 400, 200


def _base(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    s = np.arange(N)
    loss = (0.42 + 0.3 * np.exp(-s / 80)) * np.exp(rng.normal(0, 0.12, N))
    grad = 0.5 * np.exp(rng.normal(0, 0.2, N)) * (1 + 0.1 * s / N)
    return loss, grad


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [1024.0, 100.0])
def test_a_logged_loss_scale_is_no_divergence(tmp_path, seed, k):
    loss, grad = _base(seed)
    loss[AT:] *= k
    summary = build_summary(make_run(tmp_path, steps=N, loss=loss, grad_norm=grad, lr=1e-3))
    assert [f for f in summary["findings"] if f["severity"] != "info"] == []
    (f,) = [f for f in summary["findings"] if "changed scale" in f["title"]]
    assert f["first_step"] == AT and f["evidence"]["logged"]


@pytest.mark.parametrize("seed", range(3))
def test_a_loss_that_rises_with_its_gradients_and_keeps_rising_diverges(tmp_path, seed):
    loss, grad = _base(seed)
    ramp = np.clip(np.arange(N) - AT, 0, None)
    loss *= np.exp(0.03 * ramp)
    grad *= np.exp(0.04 * ramp)
    ids = {f["id"] for f in build_summary(make_run(tmp_path, steps=N, loss=loss,
                                                   grad_norm=grad, lr=1e-3))["findings"]
           if f["severity"] != "info"}
    assert ids & {"loss_divergence", "gradient_explosion"}, ids


def test_a_loss_jump_at_a_learning_rate_jump_is_not_read_as_logging(tmp_path):
    loss, grad = _base(0)
    loss[AT:] *= 20
    lr = np.where(np.arange(N) >= AT, 3e-2, 1e-3)
    summary = build_summary(make_run(tmp_path, steps=N, loss=loss, grad_norm=grad, lr=lr))
    assert not any("changed scale" in f["title"] for f in summary["findings"])
