"""Which samples each step trained on: the indices a ``torch.utils.data.DataLoader``'s
sampler drew for the batches of the step (``record_sample_ids``), so that a loss spike or a
NaN names its samples, and ``tracealyze query`` can join them with the dataset.

The DataLoader's iterator draws each batch's indices from its index sampler in the main
process, ahead of the batch when workers prefetch, and delivers the batches in the same
order (``in_order``, the default). A tap put in place of that sampler (before the iterator
is made: a worker iterator draws its first batches as it starts) queues the indices as they
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
MAX_QUEUED = 4096
"""Batches whose indices may wait for their batch (prefetched ahead: workers × prefetch)."""


class SamplerTap:
    """A DataLoader's index sampler, queueing the indices it yields (in draw order)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.drawn: deque[Any] = deque(maxlen=MAX_QUEUED)

    def __iter__(self) -> Iterator[Any]:
        # A new pass (a new loader iterator, or a persistent-workers one reset): whatever an
        # earlier pass drew and never delivered belongs to an abandoned iterator.
        self.drawn.clear()
        for idx in self.inner:
            self.drawn.append(idx)
            yield idx

    def __len__(self) -> int:
        return len(self.inner)

    def take(self) -> list[int] | None:
        """The sample ids of the oldest batch drawn and not yet delivered (None: unnamed)."""
        return ids_of(self.drawn.popleft()) if self.drawn else None

    def __getattr__(self, name: str) -> Any:  # (sampler attributes: set_epoch, batch_size)
        return getattr(self.inner, name)


def install(loader: Any) -> SamplerTap | None:
    """Tap the index sampler of a Map-style ``torch`` DataLoader before its iterator is made
    (a worker iterator draws its prefetched batches' indices as it starts); None for any
    other loader, or one that may deliver batches out of order."""
    from torch.utils.data import DataLoader

    base = getattr(loader, "__dict__", {}).get("base_dataloader")
    if isinstance(base, DataLoader):
        # accelerate's DataLoaderShard (the Trainer's; it passes isinstance as a DataLoader):
        # it iterates its base DataLoader in order and yields every batch, unless it skips
        # some to resume mid-epoch
        if getattr(loader, "skip_batches", 0):
            return None
        loader = base
    if not isinstance(loader, DataLoader) or getattr(loader, "_dataset_kind", None) != 0:
        return None
    if getattr(loader, "in_order", True) is False:
        return None
    attr = "batch_sampler" if loader.batch_sampler is not None else "sampler"
    current = getattr(loader, attr)
    if isinstance(current, SamplerTap):
        return current
    tap = SamplerTap(current)
    try:  # (DataLoader refuses a new sampler through its own __setattr__ once built)
        object.__setattr__(loader, attr, tap)
    except (AttributeError, TypeError):
        return None
    return tap


def tap_running(it: Any, tap: SamplerTap, in_flight: int) -> bool:
    """Tap a DataLoader iterator already made (Lightning makes its first one before any
    callback runs): its further draws go through ``tap``, after ``in_flight`` empty
    entries for the batches it drew before (those go unnamed). Private attributes of
    torch's iterators; False, touching nothing, when they are not as expected."""
    inner = getattr(it, "_sampler_iter", None)
    if inner is None or not hasattr(it, "_index_sampler") or in_flight < 0:
        return False

    def draws() -> Iterator[Any]:
        for idx in inner:
            tap.drawn.append(idx)
            yield idx

    tap.drawn.clear()
    tap.drawn.extend([None] * in_flight)
    it._sampler_iter = draws()
    it._index_sampler = tap  # (a persistent-workers iterator's next pass draws from it)
    return True


def in_flight(it: Any) -> int | None:
    """Batches a torch DataLoader iterator has drawn the indices of but not yielded yet:
    none for the single-process one (it draws as it yields); the multi-process one sends
    indices ahead to its workers. None for any other iterator."""
    name = type(it).__name__
    if name == "_SingleProcessDataLoaderIter":
        return 0
    if name == "_MultiProcessingDataLoaderIter" and getattr(it, "_in_order", True):
        sent, received = getattr(it, "_send_idx", None), getattr(it, "_rcvd_idx", None)
        if type(sent) is int and type(received) is int and sent >= received:
            return sent - received
    return None


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
