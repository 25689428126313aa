"""Timing a framework's own data loader: how long each ``next()`` waits for a batch.

Frameworks iterate the loader themselves, so ``rec.wrap_loader`` cannot be put around it.
The loader object's class is swapped for a subclass whose ``__iter__`` times each batch
(everything else, ``len``, ``set_epoch``, attributes, is the loader's own) and swapped back
at the end of training. Where that is impossible (a C type, ``__slots__``), nothing is
timed and ``data_wait_s`` stays empty.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from ..training.loader import timed_loader
from ..training.samples import SamplerTap


def time_batches(loader: Any, on_wait: Callable[..., None],
                 sample_ids: bool = False) -> Callable[[], None] | None:
    """Make ``loader`` report each batch's wait to ``on_wait`` (and its sample ids when the
    loader's own iterator draws them: loader.timed); returns the undo (or None when the
    loader cannot be timed)."""
    cls = type(loader)
    if loader is None or getattr(cls, "_tracealyze_timed", False):
        return None
    base_iter = cls.__iter__

    def __iter__(self: Any) -> Iterator[Any]:
        return timed_loader(self, on_wait, sample_ids, base_iter)

    return _swap(loader, cls, {"__iter__": __iter__})


def time_next(fetcher: Any, on_wait: Callable[..., None],
              drawn: SamplerTap | None = None) -> Callable[[], None] | None:
    """The same for an iterator-like object the framework calls ``next()`` on (Lightning's
    data fetcher, whose loader iterator exists before any callback runs); ``drawn``: the
    tap of its loader's sampler (samples.py), each batch taking the oldest indices."""
    cls = type(fetcher)
    if fetcher is None or getattr(cls, "_tracealyze_timed", False) or \
            not hasattr(cls, "__next__"):
        return None
    base_next = cls.__next__

    def __next__(self: Any) -> Any:
        t0 = time.perf_counter()
        batch = base_next(self)  # StopIteration passes through
        try:
            if drawn is None:
                on_wait(time.perf_counter() - t0, batch)
            else:
                on_wait(time.perf_counter() - t0, batch, drawn.take())
        except Exception:
            pass
        return batch

    return _swap(fetcher, cls, {"__next__": __next__})


def _swap(obj: Any, cls: type, methods: dict[str, Any]) -> Callable[[], None] | None:
    timed = type(cls.__name__, (cls,), {
        **methods, "_tracealyze_timed": True, "__module__": cls.__module__,
        "__qualname__": cls.__qualname__})
    try:
        _set_class(obj, timed)
    except (TypeError, AttributeError):
        return None

    def undo() -> None:
        if type(obj) is timed:
            _set_class(obj, cls)
    return undo


def _set_class(obj: Any, cls: type) -> None:
    # object's own __class__ setter: some loaders (accelerate's DataLoaderShard) shadow
    # __class__ with a read-only property so that they pass for a torch DataLoader.
    object.__dict__["__class__"].__set__(obj, cls)
