"""New input shapes per step (the ``steps.new_shapes`` column).

Memory that grows only when the model meets an input shape it has not seen is a per-shape
cache, not a leak: oneDNN's primitives on the CPU, cuDNN's autotuned plans under
``cudnn.benchmark``, a compiled model's recompilations, a user's table of masks or position
codes per length. Each grows once per distinct shape and stops when the shapes recur; a leak
grows with steps. The analyzer (memory_leak) can only tell the two apart if it knows which
steps brought a new shape, so the recorder counts them from the batches it is handed (a
wrapped loader, a framework's callback, ``tracealyze record``): the shapes and dtypes of
their tensors, host-side metadata read at the batch's arrival (no device work, no sync).

A loop that hands the recorder no batch (it builds its tensors and calls the model) still
meets its shapes at the model: with ``model=``, the positional arguments of the model's
first forward after each step's start, and of the first forward after each backward (the
next micro-batch, an evaluation inside the step), are read instead
(:meth:`ShapeLog.watch_forward`). The hook is one-shot: armed at the step's start (and again
when a backward reaches the model's first trainable parameter: a pre-hook on that
parameter's gradient accumulator, an autograd node, not the model's state) and taken off at
the forward's first line, so torch's process-wide module-hook dispatch (``modhooks.py``,
~2.6 µs per module call while live) is live only between forwards, never during one; armed
through ``modhooks``, not the model's own hook table, so ``torch.save(model)`` pickles
nothing of tracealyze. What it does not see: a second forward with no backward between
(the other images of an evaluation loop), keyword arguments (torch's process-wide
pre-hooks receive positional ones only), a ``torch.compile``'d model (not armed: telemetry
stays out of compiled code). Once a batch arrives through a loader, the loader's count is
used and the hook is no longer armed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

MAX_SIGNATURES = 65_536
"""Distinct signatures remembered; past them the count stops (the column is then null):
a loop whose every batch is a new shape says so long before, and the set stays bounded
(a few MB)."""
MAX_TENSORS = 16
"""Tensors read per batch (the first ones, nested one level)."""


class ShapeLog:
    """The batch signatures seen so far; :meth:`count` adds a batch's novelty to its step."""

    def __init__(self) -> None:
        self.seen: set[tuple[Any, ...]] = set()
        self.full = False
        self.model: Any = None  # watch_forward's model, until a loader hands batches
        self._open: Callable[[], Any] | None = None
        self._hook: Any = None
        self._bw: Any = None  # the re-arming hook on a gradient accumulator (_after_backward)
        self._node: Any = None  # ... and that accumulator

    def watch_forward(self, model: Any, open_acc: Callable[[], Any]) -> None:
        """Read the shapes at ``model``'s first forward of each step and the first after
        each backward (``open_acc()``: the open step), from now until :meth:`count` is
        handed a loader's batch."""
        self.model, self._open = model, open_acc
        self.step_started()

    def step_started(self) -> None:
        """A step opened (or a backward reached the first parameter): arm the one-shot
        hook for the next forward."""
        if self.model is not None and self._hook is None:
            from ..tensors import modhooks

            self._hook = modhooks.forward_pre(self.model, self._at_forward)

    def close(self) -> None:
        """Take the hooks off (closing, or a loader hands the batches now)."""
        self.model = None
        for name in ("_hook", "_bw"):
            hook = getattr(self, name)
            setattr(self, name, None)
            if hook is not None:
                hook.remove()
        self._node = None

    def _at_forward(self, module: Any, args: Any) -> None:
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.remove()  # (first line: the dispatch is off for the rest of the forward)
        if self._open is not None and self.model is not None:
            self._count(self._open(), args)
            self._after_backward()

    def _after_backward(self) -> None:
        """Arm again once this forward's backward reaches the model's first trainable
        parameter (a hook on its gradient accumulator, an autograd node outside the
        model's state): the next micro-batch's forward, or an evaluation the step runs
        after its backward, is read too."""
        import torch

        if not torch.is_grad_enabled():
            return
        if self._bw is not None:  # (the previous forward's; fired or never will)
            self._bw.remove()
            self._bw = None
        param = next((p for p in self.model.parameters() if p.requires_grad), None)
        if param is None:
            return
        # (held: torch caches a parameter's accumulator weakly, and this forward's graph
        # must take the one hooked, not a new one)
        self._node = torch.autograd.graph.get_gradient_edge(param).node
        self._bw = self._node.register_prehook(lambda _grads: self.step_started())

    def count(self, acc: Any, batch: Any) -> None:
        """A loader's batch: add 1 to ``acc.new_shapes`` when its signature is new, 0 when
        it was seen (a step with batches is counted; one with none, or a full log, stays
        None). From the first one on, the loader's batches are the count."""
        if self.model is not None:
            self.close()
        self._count(acc, batch)

    def _count(self, acc: Any, batch: Any) -> None:
        if self.full:
            acc.new_shapes = None
            return
        sig = signature(batch)
        if not sig:
            return
        new = sig not in self.seen
        if new and len(self.seen) >= MAX_SIGNATURES:
            self.full = True
            acc.new_shapes = None
            return
        if new:
            self.seen.add(sig)
        acc.new_shapes = (acc.new_shapes or 0) + int(new)


def signature(batch: Any) -> tuple[Any, ...]:
    """(shape, dtype) of the batch's first tensors, in order, one level into lists, tuples
    and mappings (``(x, y)``, ``{"input_ids": ..., "attention_mask": ...}``)."""
    import torch

    out: list[Any] = []

    def walk(v: Any, depth: int) -> None:
        if isinstance(v, torch.Tensor):
            out.append((tuple(v.shape), v.dtype))
        elif depth > 0:
            items = (v.values() if isinstance(v, Mapping)
                     else v if isinstance(v, (list, tuple)) else ())
            for w in list(items)[:MAX_TENSORS]:
                if len(out) < MAX_TENSORS:
                    walk(w, depth - 1)

    walk(batch, 2)  # (the batch, its items, theirs)
    return tuple(out)
