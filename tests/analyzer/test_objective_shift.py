"""stats/shift.objective_shift on generated runs with known answers (issue 45: "when every
gradient scales by the same factor at once, the subject is the loss/objective")."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.stats.shift import objective_shift, one_factor


def _run(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    step = np.arange(n)
    level = 0.4 + 1.6 * np.exp(-step / (n / 4))         # a falling training loss
    loss = level * np.exp(rng.normal(0, rng.uniform(0.03, 0.25), n))
    grad = (0.5 + level) * np.exp(rng.normal(0, rng.uniform(0.05, 0.35), n))
    return step, loss, grad


@pytest.mark.parametrize("seed", range(30))
def test_a_rescaled_objective_is_found_at_its_step(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(150, 1500))
    step, loss, grad = _run(rng, n)
    at = int(rng.integers(int(0.2 * n), int(0.8 * n)))
    k = float(rng.uniform(np.log(1.8), np.log(6)))
    up_loss, up_grad = loss.copy(), grad.copy()
    up_loss[at:] *= np.exp(k)
    up_grad[at:] *= np.exp(k)
    sh = objective_shift(step, up_loss, up_grad)
    assert sh is not None and abs(sh.step - at) <= 1, (at, sh)
    assert abs(np.log(sh.factor) - k) < 0.2
    # the same step downwards is what a learning transition looks like: not read as one
    loss[at:] *= np.exp(-k)
    grad[at:] *= np.exp(-k)
    assert objective_shift(step, loss, grad) is None


@pytest.mark.parametrize("seed", range(20))
def test_healthy_runs_and_spikes_are_not(seed: int) -> None:
    rng = np.random.default_rng(500 + seed)
    n = int(rng.integers(150, 1500))
    step, loss, grad = _run(rng, n)
    if seed % 2:  # one bad batch: a step that comes back down
        i = int(rng.integers(10, n - 10))
        loss[i] *= 50
        grad[i] *= 50
    assert objective_shift(step, loss, grad) is None


@pytest.mark.parametrize("seed", range(20))
def test_the_loss_alone_stepping_up_for_good_is_a_change_of_what_is_logged(seed: int) -> None:
    """The gradients stay where they were: what the optimizer follows did not change scale,
    the value handed to the recorder did (a manual loss scale logged before unscaling, other
    units). Found at its step, the gradients left as they are (stats/shift.LOGGED_MIN); a loss
    alone that steps up and comes back, or by less than LOGGED_MIN, is not."""
    rng = np.random.default_rng(700 + seed)
    n = int(rng.integers(150, 1500))
    step, loss, grad = _run(rng, n)
    at = int(rng.integers(int(0.2 * n), int(0.8 * n)))
    k = float(rng.choice([12.0, 100.0, 1024.0]))
    up = loss.copy()
    up[at:] *= k
    sh = objective_shift(step, up, grad)
    assert sh is not None and sh.logged and sh.grad_factor == 1.0, sh
    assert abs(sh.step - at) <= 1 and abs(np.log(sh.factor / k)) < 0.2, (at, sh)
    back = loss.copy()
    back[at:at + max(10, n // 40)] *= k  # a stretch that comes back down
    assert objective_shift(step, back, grad) is None
    for f in (1.3, 3.0):  # (under LOGGED_MIN: a loss with a high floor can rise so)
        small = loss.copy()
        small[at:] *= f
        assert objective_shift(step, small, grad) is None


def test_a_divergence_is_not_a_rescale() -> None:
    rng = np.random.default_rng(7)
    step, loss, grad = _run(rng, 400)
    ramp = np.clip((step - 200) / 40, 0, None)        # grows over 40 steps, keeps growing
    loss *= np.exp(0.15 * ramp * 40 / 40 * ramp)
    grad *= np.exp(0.2 * ramp * ramp)
    assert objective_shift(step, loss, grad) is None


@pytest.mark.parametrize("seed", range(10))
def test_one_term_of_a_sum_rescaled_moves_loss_and_gradients_by_different_factors(
        seed: int) -> None:
    """A VAE whose reconstruction term goes from a mean to a sum: the loss ×3.4, the gradient
    norm ×7, at the same step, both staying: still the objective (found, dated)."""
    rng = np.random.default_rng(2000 + seed)
    step, loss, grad = _run(rng, 400)
    loss[200:] *= 3.4
    grad[200:] *= 7.0
    sh = objective_shift(step, loss, grad)
    assert sh is not None and abs(sh.step - 200) <= 1


def test_fast_early_learning_is_not_a_rescale() -> None:
    """An abrupt early fall (a model that finds the task in a few steps): no level held
    before it, so it is learning, not the objective."""
    rng = np.random.default_rng(3)
    step, loss, grad = _run(rng, 300)
    loss[13:] *= 0.13
    grad[13:] *= 0.3
    assert objective_shift(step, loss, grad) is None


def _classifier(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A small-batch image classifier: each batch's hardness moves its loss (±60%) and its
    gradient norm together (per-step correlation ~0.8, as measured on the matrix's ResNet,
    CNN and MLP-Mixer), so a x2 on the loss stands only ~3 standard errors above its noise."""
    step = np.arange(n)
    level = 0.15 + 2.0 * np.exp(-step / (n / 6))
    hard = rng.normal(0, rng.uniform(0.45, 0.6), n)
    loss = level * np.exp(hard + rng.normal(0, 0.2, n))
    grad = (0.3 + 0.3 * level) * np.exp(0.55 * hard + rng.normal(0, 0.12, n))
    return step, loss, grad


def test_a_rescale_under_a_noisy_classifiers_loss_is_found_by_both_measurements() -> None:
    """The loss (~3 standard errors) and the gradient norm (~6) are two measurements of one
    event; together they find it, dated to its step, where the loss alone did not (4 of 100
    on the code before). A healthy run of the same noise is never read as one."""
    found, off, healthy = 0, [], 0
    for seed in range(60):
        rng = np.random.default_rng(7000 + seed)
        n = int(rng.integers(240, 400))
        step, loss, grad = _classifier(rng, n)
        at = int(rng.integers(int(0.4 * n), int(0.6 * n)))
        healthy += objective_shift(step, loss, grad) is not None
        loss[at:] *= 2.5
        grad[at:] *= 2.5
        sh = objective_shift(step, loss, grad)
        if sh is not None:
            found += 1
            off.append(abs(sh.step - at))
    assert healthy == 0
    assert found >= 0.7 * 60, found
    assert np.mean(np.asarray(off) <= 1) >= 0.9, off


def test_a_loss_that_turns_unstable_is_not_a_rescale_when_the_loss_alone_is_inconclusive(
        ) -> None:
    """A constant-rate classifier whose loss jumps x3 while its gradient norm goes x1.8 (more
    batches going wrong, as the matrix's ResNet at step 237): the ratio of loss to gradient
    norm moves, which a rescale cannot do. Where the loss alone is not conclusive (under 5
    standard errors) that keeps it from being read as one; a rescale of the same runs is."""
    unstable = rescaled = 0
    for seed in range(60):
        rng = np.random.default_rng(9000 + seed)
        step, loss, grad = _classifier(rng, 300)
        at = int(rng.integers(120, 180))
        a_l, a_g = loss.copy(), grad.copy()
        a_l[at:] *= 3.0
        a_g[at:] *= 1.8
        unstable += objective_shift(step, a_l, a_g) is not None
        loss[at:] *= 3.0
        grad[at:] *= 3.0
        rescaled += objective_shift(step, loss, grad) is not None
    assert rescaled >= 0.8 * 60, rescaled
    assert unstable <= 0.35 * 60, unstable


def _tensors(rng: np.random.Generator, factors: np.ndarray, w: int = 20
             ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per-tensor gradient norms over w steps before and after a change that multiplies
    tensor i's by factors[i]: each at its own level, with its own per-step noise."""
    out = []
    for f in factors:
        level, noise = np.exp(rng.uniform(-6, 2)), rng.uniform(0.02, 0.5)
        out.append((level * np.exp(rng.normal(0, noise, w)),
                    level * f * np.exp(rng.normal(0, noise, w))))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_a_rescale_moves_every_tensors_gradient_by_one_factor(seed: int) -> None:
    """The loss ×k (a weight, a sum for a mean): every gradient ×k exactly, each seen through
    its own batch noise (2 to 80 tensors, k from 1.5 to 10^4)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 80))
    k = float(np.exp(rng.uniform(np.log(1.5), np.log(1e4))))
    assert one_factor(_tensors(rng, np.full(n, k))) is True


@pytest.mark.parametrize("seed", range(40))
def test_a_change_of_units_moves_them_by_different_factors(seed: int) -> None:
    """Targets, inputs or weights at another scale change what the model computes: each
    tensor's gradient moves by its own factor (here spread over at least ×4 between tensors),
    and that is not a rescaled objective."""
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(4, 80))
    centre = rng.uniform(np.log(3), np.log(1e4))
    spread = rng.uniform(np.log(4), np.log(1e3))
    factors = np.exp(centre + spread * (rng.permutation(n) / (n - 1) - 0.5))
    assert one_factor(_tensors(rng, factors)) is False


def test_too_few_tensors_or_points_tell_nothing() -> None:
    rng = np.random.default_rng(5)
    assert one_factor(_tensors(rng, np.array([10.0]))) is None
    assert one_factor(_tensors(rng, np.array([10.0, 100.0]), w=3)) is None
    # one tensor of many off (an expert fed by other tokens) is not enough to say no
    assert one_factor(_tensors(rng, np.r_[np.full(19, 8.0), 80.0])) is True
