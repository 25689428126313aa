"""Two readings of a run's level changes (issue 45, items 1-2).

A loss that steps up at one step to a level it holds, while the gradient norm does not move,
is what the loss measures changing (an auxiliary term switched on, a harder data source):
one update cannot make a model k times worse without its gradients changing. It is reported
at info and the loss after it is judged on its new level, not as a divergence.

A gradient norm that rose as the model began to learn, held that level, then blew up into
NaN much later, exploded from the later rise, not from the first.
"""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary
from tracealyze.analyzer.stats.shift import loss_level_shift

from tests.runfactory import make_run

N = 360


def _series(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s = np.arange(N)
    level = 0.3 + 0.6 * np.exp(-s / 80)
    return (s, level * np.exp(rng.normal(0, 0.15, N)),
            4.0 * np.exp(rng.normal(0, 0.2, N)))


@pytest.mark.parametrize("seed", range(8))
def test_a_loss_only_level_shift_is_found_at_its_step(seed):
    rng = np.random.default_rng(seed)
    s, loss, grad = _series(rng)
    at = int(rng.integers(100, 260))
    loss[at:] *= float(rng.uniform(2.5, 6.0))
    sh = loss_level_shift(s, loss, grad)
    assert sh is not None and abs(sh.step - at) <= 1 and sh.loss_only, (at, sh)


@pytest.mark.parametrize("seed", range(6))
def test_what_is_not_a_loss_only_level_shift(seed):
    rng = np.random.default_rng(40 + seed)
    s, loss, grad = _series(rng)
    case = seed % 3
    if case == 0:  # the gradients rose with it (a rescale or a knock: not this reading)
        loss[180:] *= 4.0
        grad[180:] *= 4.0
    elif case == 1:  # one hard batch, back on the next step
        loss[180] *= 30.0
    else:  # a divergence: the loss keeps rising
        loss *= np.exp(np.clip(s - 180, 0, None) * 0.02)
    assert loss_level_shift(s, loss, grad) is None


@pytest.mark.parametrize("seed", range(4))
def test_an_auxiliary_term_switched_on_is_no_divergence(tmp_path, seed):
    """A term at weight 0.5 added at step 180: the loss x4.5 at once, then falling; the
    gradient norm unchanged. Info, dated at 180; nothing above info."""
    rng = np.random.default_rng(60 + seed)
    s, loss, grad = _series(rng)
    loss[180:] += 1.3 * np.exp(-(s[180:] - 180) / 400)
    run = make_run(tmp_path, steps=N, loss=loss, grad_norm=grad)
    f = build_summary(run)["findings"]
    assert [x["id"] for x in f if x["severity"] != "info"] == [], f
    assert any(x.get("evidence", {}).get("loss_only") and x["first_step"] in (179, 180, 181)
               for x in f), f


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
