"""New input shapes per step (the ``steps.new_shapes`` column).

Memory that grows only when the model meets an input shape it has not seen is a per-shape
cache, not a leak: oneDNN's primitives on the CPU, cuDNN's autotuned plans under
``cudnn.benchmark``, a compiled model's recompilations, a user's table of masks or position
codes per length. Each grows once per distinct shape and stops when the shapes recur; a leak
grows with steps. The analyzer (memory_leak) can only tell the two apart if it knows which
steps brought a new shape, so the recorder counts them from the batches it is handed (a
wrapped loader, a framework's callback, ``tracealyze record``): the shapes and dtypes of
their tensors, host-side metadata read at the batch's arrival (no device work, no sync).

Not a hook on the model: a forward hook would live in the model's ``_forward_pre_hooks``,
and ``torch.save(model)`` would then pickle a tracealyze object into the user's checkpoint,
which could not be loaded where tracealyze is not installed.
"""

from __future__ import annotations

from collections.abc import Mapping
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

    def count(self, acc: Any, batch: Any) -> None:
        """Add 1 to ``acc.new_shapes`` when ``batch``'s signature is new, 0 when it was
        seen (a step with batches is counted; one with none, or a full log, stays None)."""
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
