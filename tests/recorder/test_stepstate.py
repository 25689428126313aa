"""The step state machine on its own: which step each lifecycle call belongs to and when a
step is committed, for every order a training loop or framework calls them in."""

from __future__ import annotations

from tracealyze.recorder.stepstate import StepMachine


class Loop:
    """A training loop seen by the machine: backward passes change the signature; the
    gradient read marks the target step as the recorder's hook would."""

    def __init__(self) -> None:
        self.backwards = 0
        self.committed: list[tuple[int, int]] = []  # (step, micro-batches folded in)
        self.m = StepMachine(0, lambda: self.backwards, self._commit)

    def _commit(self, acc) -> None:
        self.committed.append((acc.step, acc.floats.get("n", [0])[0]))

    def backward(self) -> None:
        self.backwards += 1

    def opt_pre(self) -> None:  # gradients ready
        t = self.m.target()
        if not t.grads_captured:
            t.grads_captured = True
            self.m.gradients_read(t)

    def opt_post(self) -> None:
        self.m.optimizer_stepped()

    def rec_step(self, *, has_optimizer: bool = True) -> None:
        acc = self.m.values_step()
        acc.floats["n"] = [acc.floats.get("n", [0])[0] + 1]
        self.m.ended(acc, complete=acc.grads_captured or not has_optimizer)


def test_plain_loop_commits_each_step_at_rec_step() -> None:
    lp = Loop()
    for _ in range(3):
        lp.backward()
        lp.opt_pre()
        lp.opt_post()
        lp.rec_step()
    assert lp.committed == [(0, 1), (1, 1), (2, 1)]
    assert lp.m.pending is None and lp.m.open.step == 3


def test_rec_step_before_the_optimizer_commits_after_it() -> None:
    lp = Loop()
    lp.backward()
    lp.rec_step()  # rec.step() first: the step waits for the optimizer
    assert lp.committed == [] and lp.m.pending is not None
    lp.opt_pre()
    lp.opt_post()
    assert lp.committed == [(0, 1)]


def test_gradient_accumulation_is_one_recorded_step() -> None:
    lp = Loop()
    for _ in range(2):  # two optimizer steps of four micro-batches each
        for _ in range(4):
            lp.backward()
            lp.rec_step()  # once per micro-batch, before the optimizer steps
        lp.opt_pre()
        lp.opt_post()
    assert lp.committed == [(0, 4), (1, 4)]


def test_optimizer_inside_the_last_micro_batch_folds_its_rec_step_in() -> None:
    lp = Loop()
    lp.backward()
    lp.rec_step()
    lp.backward()  # the last micro-batch: backward(); opt.step(); rec.step()
    lp.opt_pre()
    lp.opt_post()
    assert lp.committed == []  # its rec.step() is still to come
    lp.rec_step()  # folded into the step it belongs to, which is complete now
    assert lp.committed == [(0, 2)]
    assert lp.m.pending is None and lp.m.open.step == 1


def test_a_step_without_backward_or_optimizer_is_its_own_step() -> None:
    lp = Loop()
    lp.backward()
    lp.rec_step()  # pending, waiting for the optimizer
    lp.rec_step()  # again with no backward in between: evaluation, not accumulation
    assert lp.committed == [(0, 1)]
    assert lp.m.pending is not None and lp.m.pending.step == 1


def test_without_an_optimizer_every_rec_step_commits() -> None:
    lp = Loop()
    for _ in range(3):
        lp.backward()
        lp.rec_step(has_optimizer=False)
    assert lp.committed == [(0, 1), (1, 1), (2, 1)]


def test_drain_hands_over_the_pending_step_once() -> None:
    lp = Loop()
    lp.backward()
    lp.rec_step()
    first = lp.m.drain()
    assert first is not None and first.step == 0
    assert lp.m.drain() is None
