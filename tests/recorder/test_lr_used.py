"""The learning rate recorded for a step is the one its optimizer update used.

The usual loop steps the scheduler right after the optimizer and ends the step after that
(``opt.step(); sched.step(); rec.step(loss)``): read at ``rec.step()``, the rate is already
the next step's, so a restart or a decay was dated one step early (a held-out SGDR script's
explosion "right after the learning rate went to 5 at step 249", the rate first used at
250). The optimizer's pre-hook reads it as the update uses it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rec_helpers import FAST, batches, loss_fn, steps_by_number, tiny_model
from tracealyze.recorder import Recorder

N = 6


def _run(run_dir: Path, order: str, accumulate: int = 1) -> list[float]:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.8)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    used = []
    data = batches(N * accumulate)
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        for i in range(N):
            opt.zero_grad()
            for k in range(accumulate):
                x, y = data[i * accumulate + k]
                loss = loss_fn(model, x, y) / accumulate
                loss.backward()
                if k < accumulate - 1:
                    rec.step(loss=loss)  # a micro-batch: folded into the optimizer step
            used.append(opt.param_groups[0]["lr"])
            if order == "step_first":  # rec.step() before the update (hooks finish it)
                rec.step(loss=loss)
                opt.step()
                sched.step()
            else:  # the usual order: update, scheduler, then the step's end
                opt.step()
                sched.step()
                rec.step(loss=loss)
    return used


@pytest.mark.parametrize("order", ["usual", "step_first"])
@pytest.mark.parametrize("accumulate", [1, 3])
def test_recorded_lr_is_the_one_the_update_used(run_dir: Path, order: str,
                                                accumulate: int) -> None:
    used = _run(run_dir, order, accumulate)
    steps = steps_by_number(run_dir)
    assert [steps[s]["lr"] for s in sorted(steps)] == pytest.approx(used)
    assert used[:3] == [0.8, 0.4, 0.2]


def test_a_given_lr_still_wins(run_dir: Path) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.8)
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
        for x, y in batches(3):
            opt.zero_grad()
            loss = loss_fn(model, x, y)
            loss.backward()
            opt.step()
            rec.step(loss=loss, lr=0.3)
    assert {s["lr"] for s in steps_by_number(run_dir).values()} == {0.3}
