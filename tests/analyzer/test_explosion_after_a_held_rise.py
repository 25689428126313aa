"""An explosion dated at its own rise (issue 45, item 1): a gradient norm that rose as the
model began to learn, held that level, then blew up into NaN much later, exploded from the
later rise, not from the first."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run


@pytest.mark.parametrize("seed", range(4))
def test_an_explosion_after_a_learning_rise_that_held_is_dated_at_its_own_rise(tmp_path,
                                                                                seed):
    """The total gradient norm rises x6 over steps 40-76 while the loss falls (the model
    starts to learn), holds that level to 149, then grows x1e4 a step into NaN at 153."""
    rng = np.random.default_rng(80 + seed)
    n = 200
    s = np.arange(n)
    grad = np.where(s < 40, 0.15, np.where(s < 76, 0.15 * 6 ** ((s - 40) / 36), 0.9))
    grad = grad * np.exp(rng.normal(0, 0.3, n))
    loss = np.where(s < 40, 1.79, np.maximum(1.79 - 0.006 * (s - 40), 1.4))
    loss = loss * np.exp(rng.normal(0, 0.03, n))
    grad[150:153] = [60.0, 5e3, 2e14]
    loss[150:153] = [130.0, 2.7e3, 7e14]
    grad[153:], loss[153:] = np.nan, np.nan
    run = make_run(tmp_path, steps=n, loss=loss, grad_norm=grad, nonfinite_grads=np.where(
        s >= 153, 1, 0))
    f = [x for x in build_summary(run)["findings"] if x["id"] == "gradient_explosion"]
    assert f and f[0]["severity"] in ("error", "critical"), f
    assert abs(f[0]["first_step"] - 150) <= 1, f[0]["first_step"]
