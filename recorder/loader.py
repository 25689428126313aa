"""``rec.wrap_loader``: the same iterable, timing how long each step waits for its data."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any


class TimedLoader:
    """Iterates a loader and reports the time spent waiting for each batch (the step
    lifecycle's ``data_wait_ended``)."""

    def __init__(self, loader: Iterable[Any], on_wait: Callable[[float], None]) -> None:
        self.loader = loader
        self.on_wait = on_wait

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        return timed(iter(self.loader), self.on_wait)


def timed(it: Iterator[Any], on_wait: Callable[[float], None]) -> Iterator[Any]:
    """``it``'s items, reporting how long each ``next()`` waited."""
    clock = time.perf_counter
    while True:
        t0 = clock()
        try:
            batch = next(it)
        except StopIteration:
            return
        on_wait(clock() - t0)
        yield batch
