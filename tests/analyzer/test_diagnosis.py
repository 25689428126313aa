"""Diagnosis you can trust (issue #13), on synthetic runs with the shapes real models showed:
no alarm on normal training dynamics, the cause named and listed before its symptoms."""

from __future__ import annotations

import numpy as np
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run


def findings(run) -> list[dict]:
    return build_summary(run)["findings"]


def ids(run) -> list[str]:
    return [f["id"] for f in findings(run)]


S = np.arange(300)
FALLING = 4.0 - 2.5 * (1 - np.exp(-S / 80.0))  # a loss that keeps learning


def test_layer_gradient_growing_while_the_loss_falls_is_learning(tmp_path):
    """BERT's attention query/key weights: gradients start near zero and grow 1000x as the
    heads learn to attend, while the loss keeps falling. Not an explosion."""
    def norm(s, name, kind):
        if kind == "grad" and name == "layers.1.weight":
            return 1e-5 * np.exp(np.minimum(s, 200) / 25.0)  # ×3000 by step 200
        return None
    run = make_run(tmp_path, steps=300, loss=FALLING, tensors=6, tensor_norm=norm)
    assert "gradient_explosion" not in ids(run)


def test_early_training_rise_is_not_an_explosion(tmp_path):
    """Norms rising 20x in the first steps and settling (the normal start of training)."""
    g = np.where(S < 12, 0.05 * 1.3 ** S, 0.05 * 1.3 ** 12)
    run = make_run(tmp_path, steps=300, loss=FALLING, grad_norm=g, tensors=4)
    assert "gradient_explosion" not in ids(run)


def test_explosion_after_an_lr_jump_names_the_jump_and_comes_first(tmp_path):
    lr = np.where(S < 150, 3e-4, 3e-2)
    g = np.where(S < 150, 1.0, 1.25 ** np.minimum(S - 150, 60))
    g = g.astype(float)
    g[250:] = np.nan  # ... until it overflows
    loss = np.where(S < 150, FALLING, FALLING[149] + 0.05 * (S - 150))
    loss = loss.astype(float)
    loss[250:] = np.nan
    run = make_run(tmp_path, steps=300, loss=loss, lr=lr, grad_norm=g, tensors=4,
                   nonfinite_grads=(S >= 250).astype(int))
    fs = findings(run)
    top = fs[0]
    assert top["id"] == "gradient_explosion", [f["id"] for f in fs]
    assert top["first_step"] == 150
    assert "learning rate went from 0.0003 to 0.03" in top["message"]
    assert top["evidence"]["cause"]["step"] == 150
    nan = next(f for f in fs if f["id"] == "nonfinite")
    assert nan["caused_by"] == "gradient_explosion"
    assert "nonfinite" in top["explains"]
    # the symptom (critical) is listed after its cause (error)
    assert [f["id"] for f in fs].index("nonfinite") > 0


def test_divergence_to_a_worse_level_after_an_lr_jump(tmp_path):
    """A ×100 LR jump at step 150: the loss spikes and settles at a level worse than it had
    reached, still below where it started (the rule used to need it above the start)."""
    rng = np.random.default_rng(0)
    loss = np.where(S < 150, 4.2 - 3.0 * S / 150, 3.2) + rng.normal(0, 0.05, 300)
    loss[150:153] = 6.0
    lr = np.where(S < 150, 1e-3, 1e-1)
    run = make_run(tmp_path, steps=300, loss=loss, lr=lr)
    fs = findings(run)
    (d,) = [f for f in fs if f["id"] == "loss_divergence"]
    assert d["first_step"] == 150 and "learning rate went from 0.001 to 0.1" in d["message"]
    assert d["caused_by"] is None
    plateau = [f for f in fs if f["id"] == "loss_plateau"]
    assert all(p["first_step"] >= 140 for p in plateau)  # not "flat from step 0"


def test_noisy_flat_loss_ending_at_its_best_is_not_divergence(tmp_path):
    rng = np.random.default_rng(3)
    loss = 2.0 + rng.normal(0, 0.1, 300)
    run = make_run(tmp_path, steps=300, loss=loss)
    assert "loss_divergence" not in ids(run)


def test_parameter_with_no_gradient_by_construction_is_info(tmp_path):
    """An attention key bias: its gradient is ~1e-10 from the start while its module's
    weight learns normally."""
    def norm(s, name, kind):
        if kind == "grad" and name == "layers.2.bias":
            return np.full(len(s), 1e-10)
        return None
    run = make_run(tmp_path, steps=300, loss=FALLING, tensors=8, tensor_norm=norm)
    (f,) = [f for f in findings(run) if f["id"] == "vanishing_gradient"]
    assert f["severity"] == "info" and f["subject"] == "layers.2.bias"
    assert "zero by construction" in f["title"]


def test_rounding_noise_gradient_drifting_down_is_not_vanishing(tmp_path):
    """MLP-Mixer's token-MLP output bias (a per-token shift the next LayerNorm removes): its
    gradient is float rounding noise: ~4e-9 at initialisation settling to ~1e-9 within the
    first tens of steps, scattering from step to step, while its weight learns. Found in a
    healthy matrix run (these are its levels), where the first steps' maximum against the
    late median read as a decade's decline."""
    rng = np.random.default_rng(1)

    def norm(s, name, kind):
        if kind == "grad" and name == "layers.2.bias":
            v = (1e-9 + 4e-9 * np.exp(-s / 15.0)) * np.exp(rng.normal(0, 0.3, len(s)))
            v[3] *= 5.0  # one step's outlier at initialisation
            return v
        return None
    run = make_run(tmp_path, steps=300, loss=FALLING, tensors=8, tensor_norm=norm)
    fs = [f for f in findings(run) if f["id"] == "vanishing_gradient"]
    assert [(f["severity"], f["subject"]) for f in fs] == [("info", "layers.2.bias")]


def test_early_stall_names_the_learning_rate(tmp_path):
    """An LM at a too-high LR: the loss falls a little in the first steps, then stays at its
    unigram level for the rest of the run."""
    rng = np.random.default_rng(2)
    loss = np.maximum(5.45, 5.8 - 0.03 * S) + rng.normal(0, 0.05, 300)
    run = make_run(tmp_path, steps=300, loss=loss, lr=0.1)
    (p,) = [f for f in findings(run) if f["id"] == "loss_plateau"]
    assert p["severity"] == "warning"
    assert "learning rate was 0.1" in p["message"]


def test_nothing_measured_is_not_called_healthy(tmp_path):
    from tracealyze.analyzer.diagnosis.summary import render_text

    run = make_run(tmp_path, steps=100, loss=None, grad_norm=None, data_wait=None)
    summary = build_summary(run)
    gaps = {g["check"]: g for g in summary["not_checked"]}
    assert {"loss", "gradients", "data loading"} <= set(gaps)
    assert "loss_divergence" in gaps["loss"]["detectors"]
    assert "rec.step(loss=" in gaps["loss"]["how"]
    text = render_text(summary)
    assert "No problems found in what could be checked" in text
    assert "Not checked: loss: no loss was recorded" in text


def test_fully_recorded_run_has_nothing_unchecked(tmp_path):
    run = make_run(tmp_path, steps=100, tensors=4)
    summary = build_summary(run)
    assert summary["not_checked"] == []


def test_divergence_right_after_a_resume_names_it(tmp_path):
    """A run resumed at step 150 (say with a fresh optimizer state) that then loses what it
    had learned: the finding names the resume."""
    rng = np.random.default_rng(1)
    loss = np.where(S < 150, 4.2 - 3.0 * S / 150, 3.0) + rng.normal(0, 0.05, 300)
    run = make_run(tmp_path, steps=300, loss=loss, events=[
        {"step": 150, "kind": "resumed", "severity": "info",
         "message": "run resumed at step 150"}])
    (d,) = [f for f in findings(run) if f["id"] == "loss_divergence"]
    assert d["first_step"] == 150
    assert "resumed at step 150" in d["message"]


def test_loss_scale_collapse_is_a_change(tmp_path):
    from tracealyze.analyzer.diagnosis.detectors import _changes
    from tracealyze.analyzer.diagnosis.detectors.base import Context
    from tracealyze.analyzer.run.catalog import open_run

    scale = 65536.0 / 2.0 ** np.clip(S - 199, 0, 6)
    run = make_run(tmp_path, steps=300, loss_scale=scale)
    with open_run(run) as r:
        (c,) = _changes.other_changes(Context(run=r))
    assert c["kind"] == "loss_scale" and 199 <= c["step"] <= 200
    assert "65536" in c["text"]


def test_long_converged_run_raises_nothing(tmp_path):
    """A converged 30,000-step run: the loss at its noise floor, gradient norms noisy in log
    space (bias gradients near convergence jump 10x from step to step), the odd deep dip.
    (It used to get three gradient_explosion errors.)"""
    n = 30_000
    s = np.arange(n)
    rng = np.random.default_rng(5)
    loss = 2.3 * np.exp(-s / 500) + 0.05 + 0.02 * np.abs(rng.normal(0, 1, n))
    g = 0.3 * np.exp(rng.normal(0, 0.6, n))
    g[rng.integers(0, n, 30)] *= 1e-3  # dips and rebounds

    def norm(st, name, kind):
        if kind == "grad" and name.endswith("bias"):
            return 0.01 * np.exp(rng.normal(0, 1.2, len(st)))
        return None
    run = make_run(tmp_path, steps=n, loss=loss, grad_norm=g, tensors=6, tensor_norm=norm,
                   lr=1e-3)
    bad = [f for f in findings(run) if f["severity"] not in ("info",)]
    assert bad == [], [(f["id"], f["title"]) for f in bad]
