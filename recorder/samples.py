"""Which samples each step trained on: the indices a ``torch.utils.data.DataLoader``'s
sampler drew for the batches of the step (``record_sample_ids``), so that a loss spike or a
NaN names its samples, and ``tracealyze query`` can join them with the dataset.

The DataLoader's iterator draws each batch's indices from its sampler in the main process
(``_sampler_iter``), ahead of the batch when workers prefetch, and delivers the batches in
the same order (``in_order``, the default). A tap on that iterator queues the indices as they
are drawn; each batch the loader yields takes the oldest. Nothing else is read: no tensor,
no device. Loaders that are not Map-style DataLoaders (an IterableDataset, a generator, a
framework's own iterator around one) have no indices to give: the column stays null.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

MAX_IDS = 1024
"""Sample ids kept per step (the first ones): bounds a step's row whatever the batch."""


class _Tap:
    """The sampler iterator, queueing what it yields."""

    def __init__(self, inner: Iterator[Any]) -> None:
        self.inner = inner
        self.drawn: deque[Any] = deque()

    def __iter__(self) -> _Tap:
        return self

    def __next__(self) -> Any:
        idx = next(self.inner)
        self.drawn.append(idx)
        return idx


def tap(it: Any) -> _Tap | None:
    """Tap a DataLoader iterator's sampler (a fresh tap each epoch: a persistent-workers
    iterator replaces its sampler iterator when it is reset); None when ``it`` is not one
    that draws indices in order."""
    inner = getattr(it, "_sampler_iter", None)
    if inner is None or getattr(it, "_dataset_kind", None) != 0:  # 0: Map-style
        return None
    if getattr(it, "_in_order", True) is False:
        return None
    if isinstance(inner, _Tap):
        return inner
    t = _Tap(inner)
    try:
        it._sampler_iter = t
    except AttributeError:
        return None
    return t


def ids_of(drawn: Any) -> list[int] | None:
    """The int sample ids of one batch's indices (a list from a batch sampler, or one
    index without automatic batching); None for anything else (string keys, tensors)."""
    items = drawn if isinstance(drawn, (list, tuple)) else [drawn]
    out = []
    for x in items[:MAX_IDS]:
        if isinstance(x, bool) or not isinstance(x, int):
            try:
                x = int(x.__index__())  # numpy / torch integer scalars
            except (AttributeError, TypeError, ValueError):
                return None
        out.append(int(x))
    return out
