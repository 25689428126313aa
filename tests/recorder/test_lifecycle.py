"""The public step lifecycle, driven by hand as a framework (or a loop without a
torch.optim optimizer) would: data wait, gradients ready, optimizer stepped, step ended."""

from __future__ import annotations

from pathlib import Path

import torch
from rec_helpers import FAST, batches, loss_fn, rows, steps_by_number, tiny_model
from tracealyze.recorder import Recorder


def test_hand_driven_lifecycle_records_every_phase(run_dir: Path) -> None:
    model = tiny_model()
    params = list(model.parameters())
    with Recorder(run_dir, model=model, update_ratio_every=2, **FAST) as rec:
        for i, (x, y) in enumerate(batches(6)):
            rec.data_wait_ended(0.01)
            for p in params:
                p.grad = None
            loss = loss_fn(model, x, y)
            loss.backward()
            rec.gradients_ready()          # before the weights change
            with torch.no_grad():          # a hand-written SGD step
                for p in params:
                    p -= 0.1 * p.grad
            rec.optimizer_stepped()
            rec.step_ended(loss, lr=0.1, batch=float(i))
    steps = steps_by_number(run_dir)
    assert sorted(steps) == list(range(6))
    assert all(abs(s["data_wait_s"] - 0.01) < 1e-9 for s in steps.values())
    assert all(s["grad_norm"] is not None and s["grad_norm"] > 0 for s in steps.values())
    assert all(s["lr"] == 0.1 for s in steps.values())
    kinds = {(r["kind"], r["step"]) for r in rows(run_dir, "tensor_stats")}
    # update ratios at the cadence (steps 0, 2, 4): the copy was taken at gradients_ready
    assert {s for k, s in kinds if k == "update"} == {0, 2, 4}
    ratios = [r["ratio"] for r in rows(run_dir, "tensor_stats") if r["kind"] == "update"]
    assert ratios and all(r > 0 for r in ratios)


def test_gradients_ready_is_idempotent_within_a_step(run_dir: Path) -> None:
    model = tiny_model()
    with Recorder(run_dir, model=model, **FAST) as rec:
        x, y = batches(1)[0]
        loss_fn(model, x, y).backward()
        rec.gradients_ready()
        rec.gradients_ready()
        rec.step_ended(1.0)
    norms = [r for r in rows(run_dir, "tensor_stats") if r["kind"] == "grad"]
    assert len(norms) == len(list(model.parameters()))  # read once, not twice


def test_gradients_ready_after_the_update_keeps_the_update_ratios(tmp_path) -> None:
    """A framework that calls gradients_ready() once more after the optimizer stepped (the
    transformers callback does, for steps the fp16 scaler skipped) must not re-copy the
    already-updated weights: the update is still new − old of this step, and only the
    steps at the cadence have one (a stray copy would add one at the next step)."""
    import torch
    from rec_helpers import FAST, batches, loss_fn, rows, tiny_model
    from tracealyze.recorder import Recorder

    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    truth = []
    with Recorder(tmp_path / "run", model=model, optimizer=opt, update_ratio_every=2,
                  **FAST) as rec:
        for x, y in batches(4):
            before = [p.detach().clone() for p in model.parameters()]
            opt.zero_grad()
            loss_fn(model, x, y).backward()
            opt.step()
            rec.gradients_ready()  # late, as after opt.step()
            truth.append({n: float((p.detach() - b).norm()) for (n, p), b in
                          zip(model.named_parameters(), before, strict=True)})
            rec.step()
    got = {}
    for r in rows(tmp_path / "run", "tensor_stats"):
        if r["kind"] == "update":
            got.setdefault(r["step"], {})[r["name"]] = r["norm"]
    assert sorted(got) == [0, 2]
    for step in got:
        for name, v in truth[step].items():
            assert abs(got[step][name] - v) <= 1e-5 * max(1.0, v), (step, name)
