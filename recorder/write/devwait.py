"""Waiting, on the writer thread, for the GPU to pass a step's CUDA event."""

from __future__ import annotations

import time
from typing import Any

POLL_FIRST_S = 0.0005
POLL_MAX_S = 0.01


def wait_for(event: Any, sleep: Any = None) -> None:
    """Wait on the writer thread until the GPU has passed a step's CUDA event, asleep.

    The writer wakes for a batch of steps while the GPU is still working on the latest one
    (up to a step's GPU time away). ``event.synchronize()`` spins a CPU core for that long
    under CUDA's default scheduling: 0.93 ms of CPU a step on GPT-2 small on an H200, a core
    burnt beside the training. ``query()`` never waits; between polls the writer sleeps,
    0.5 ms doubling to 10 ms (a batch's rows are late by at most that, which nobody reads
    in real time). The training thread is never involved."""
    nap = sleep or time.sleep
    delay = POLL_FIRST_S
    while not event.query():
        nap(delay)
        delay = min(delay * 2, POLL_MAX_S)
