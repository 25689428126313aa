"""``rec.wrap_loader``: the same iterable, timing how long each step waits for its data."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any


class TimedLoader:
    """Iterates a loader and reports the time spent waiting for each batch (the step
    lifecycle's ``data_wait_ended``)."""

    def __init__(self, loader: Iterable[Any], on_wait: Callable[..., None],
                 sample_ids: bool = False) -> None:
        self.loader = loader
        self.on_wait = on_wait
        self.sample_ids = sample_ids

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        return timed_loader(self.loader, self.on_wait, self.sample_ids)


def timed_loader(loader: Iterable[Any], on_wait: Callable[..., None], sample_ids: bool,
                 make_iter: Callable[[Any], Iterator[Any]] = iter) -> Iterator[Any]:
    """``timed`` over ``make_iter(loader)``, its sampler tapped first (samples.py)."""
    from .samples import install

    # tapped before the iterator is made (a worker iterator draws as it starts); a pass
    # starts the tap empty: what an abandoned pass drew is dropped (samples.py)
    drawn = install(loader) if sample_ids else None
    return timed(make_iter(loader), on_wait, drawn)


def timed(it: Iterator[Any], on_wait: Callable[..., None], drawn: Any = None
          ) -> Iterator[Any]:
    """``it``'s items, reporting how long each ``next()`` waited, and the batch itself
    (``on_wait(seconds, batch)``: its shapes), and with a sampler tap ``drawn`` the indices
    drawn for it (``on_wait(seconds, batch, ids)``; samples.py)."""
    clock = time.perf_counter
    while True:
        t0 = clock()
        try:
            batch = next(it)
        except StopIteration:
            return
        if drawn is None:
            on_wait(clock() - t0, batch)
        else:
            on_wait(clock() - t0, batch, drawn.take())
        yield batch


def batch_size_of(batch: Any, depth: int = 3) -> int | None:
    """The leading dimension of the first array-like (anything with a ``shape``) in
    ``batch``: a tensor, or one inside a tuple, list or dict (as DataLoaders, the
    transformers collators and Lightning yield them). None when there is none."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        try:
            return int(shape[0]) if len(shape) else None
        except (TypeError, ValueError, IndexError):
            return None
    if depth <= 0:
        return None
    items = batch.values() if isinstance(batch, dict) else \
        batch if isinstance(batch, (list, tuple)) else ()
    for item in list(items)[:8]:
        n = batch_size_of(item, depth - 1)
        if n is not None:
            return n
    return None
