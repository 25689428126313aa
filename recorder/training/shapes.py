"""New input shapes per step (the ``steps.new_shapes`` column).

Memory that grows only when the model meets an input shape it has not seen is a per-shape
cache, not a leak: oneDNN's primitives on the CPU, cuDNN's autotuned plans under
``cudnn.benchmark``, a compiled model's recompilations, a user's table of masks or position
codes per length. Each grows once per distinct shape and stops when the shapes recur; a leak
grows with steps. The analyzer (memory_leak) can only tell the two apart if it knows which
steps brought a new shape, so the recorder counts them: a forward pre-hook on the model reads
the shapes and dtypes of its tensor arguments (host-side metadata: no device work, no sync)
and counts the signatures never seen before, training and evaluation forwards alike (an
evaluation's new shapes fill the same caches).
"""

from __future__ import annotations

from typing import Any

MAX_SIGNATURES = 65_536
"""Distinct signatures remembered; past them the count stops (the column is then null):
a loop whose every step is a new shape says so long before, and the set stays bounded
(a few MB)."""
MAX_TENSORS = 16
"""Tensor arguments read per forward call (the first ones, nested one level)."""


class ShapeLog:
    """Counts the model's forward calls whose input signature is new; ``take()`` at each
    step's commit returns the count since the last one (None once the log is full)."""

    def __init__(self, model: Any) -> None:
        self.seen: set[tuple[Any, ...]] = set()
        self.new = 0
        self.full = False
        self._hook = model.register_forward_pre_hook(self._at_forward, with_kwargs=True)

    def _at_forward(self, _module: Any, args: Any, kwargs: Any) -> None:
        if self.full:
            return
        try:
            sig = signature(args, kwargs)
        except Exception:  # telemetry never breaks the forward
            return
        if sig and sig not in self.seen:
            if len(self.seen) >= MAX_SIGNATURES:
                self.full = True
                return
            self.seen.add(sig)
            self.new += 1

    def take(self) -> int | None:
        n, self.new = self.new, 0
        return None if self.full else n

    def remove(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


def signature(args: Any, kwargs: Any) -> tuple[Any, ...]:
    """(shape, dtype) of the call's first tensor arguments, in order, one level into
    lists, tuples and dicts (a batch passed as a dict or a list of tensors)."""
    import torch

    out: list[Any] = []

    def add(v: Any) -> None:
        if isinstance(v, torch.Tensor) and len(out) < MAX_TENSORS:
            out.append((tuple(v.shape), v.dtype))

    for v in (*args, *kwargs.values()):
        if isinstance(v, (list, tuple)):
            for w in v[:MAX_TENSORS]:
                add(w)
        elif isinstance(v, dict):
            for w in list(v.values())[:MAX_TENSORS]:
                add(w)
        else:
            add(v)
    return tuple(out)
