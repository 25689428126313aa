"""Which recorded step each lifecycle call belongs to, and when a step is complete.

A recorded step is one optimizer step. Its values (``rec.step()``) and its gradients (the
optimizer's pre-hook, or ``gradients_ready()``) come in either order, and ``rec.step()`` may be
called once per micro-batch of gradient accumulation. :class:`StepMachine` holds the *open*
step (collecting values now) and at most one *pending* step (ended by ``rec.step()`` before
the optimizer stepped, waiting for its gradients), and hands each step to ``commit`` exactly
once, when it is complete. It does no device work and imports no torch: ``signature()``
identifies the current backward pass (``GradReader.signature``: changes with every backward).
The caller holds the recorder's lock around every call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .capture import StepAccum


class StepMachine:
    """The open step and the pending one; ``commit(step)`` receives complete steps."""

    def __init__(self, first_step: int, signature: Callable[[], Any],
                 commit: Callable[[StepAccum], None]) -> None:
        self.open = StepAccum(step=first_step)
        self.pending: StepAccum | None = None
        self._sig: Any = None  # the backward pass the pending step's rec.step() came after
        self._signature = signature
        self._commit = commit

    def target(self) -> StepAccum:
        """The step an optimizer/scaler hook belongs to: the pending one when rec.step()
        came first, else the open one."""
        return self.pending if self.pending is not None else self.open

    def values_step(self) -> StepAccum:
        """rec.step() arrived: the step its values go to. A pending step takes them when
        this call is another micro-batch of it (it is folded in: a recorded step is an
        optimizer step); a pending step that is complete as it is, is committed first."""
        pending = self.pending
        if pending is None:
            return self.open
        # Gradients read: fold this call in only if the optimizer stepped in the middle of
        # the cycle's last micro-batch (`backward(); opt.step(); rec.step()`); otherwise
        # (e.g. a step the GradScaler skipped, so no post-hook came) the pending step is
        # complete as it is. Gradients not read yet: rec.step() came again before the
        # optimizer stepped, a micro-batch of gradient accumulation if a backward ran in
        # between; else a step without an optimizer step (evaluation, a skipped step).
        fold = (pending.await_last if pending.grads_captured
                else self._signature() != self._sig)
        if fold:
            pending.fold(self.open)
            self._sig = self._signature()
            return pending
        self.pending = None
        self._commit(pending)
        return self.open

    def ended(self, step: StepAccum, *, complete: bool) -> StepAccum:
        """``step`` has its values: open the next step (returned). ``complete``: its
        gradients were read (or there is no optimizer to wait for): commit it now; else it
        waits for the optimizer as the pending step."""
        self.open = StepAccum(step=step.step + 1)
        if complete:
            self.pending = None
            self._commit(step)
        else:
            self.pending = step
            self._sig = self._signature()
        return self.open

    def gradients_read(self, step: StepAccum) -> None:
        """``step`` (:meth:`target`) just had its gradients read. On the pending step: a
        backward ran after its rec.step(), so that micro-batch's rec.step() is still to come
        and belongs to this optimizer step."""
        if step is self.pending:
            step.await_last = self._signature() != self._sig

    def optimizer_stepped(self) -> None:
        """The optimizer updated the weights: a pending step whose gradients were read and
        whose last rec.step() came is complete."""
        pending = self.pending
        if pending is None or not pending.grads_captured or pending.await_last:
            return  # rec.step() came after opt.step() (the usual order): it commits
        self.pending = None
        self._commit(pending)

    def drain(self) -> StepAccum | None:
        """The pending step, taken (the run is closing: it is committed as it is)."""
        pending, self.pending = self.pending, None
        return pending
