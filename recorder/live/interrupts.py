"""Ctrl-C while the run is being saved.

A terminal's Ctrl-C reaches every process of the foreground group, and an impatient user
presses it twice: a second ``KeyboardInterrupt`` raised inside ``Recorder.close()`` (in a
thread join) used to cut its drain short, losing the steps since the last flush and leaving
run.json ``running``. While close() drains, :class:`HeldInterrupts` holds SIGINT instead: the
first held one starts a bounded grace period (:data:`GRACE_S`) and says so on stderr; when it
runs out, close() stops waiting for the writer, still marks the run, and says what it gave up.
A held interrupt is delivered once close() is done, unless an exception is already on its way
out (the first Ctrl-C's ``KeyboardInterrupt``): the program is ending anyway.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

GRACE_S = 10.0
"""How long close() keeps draining after a second interrupt. A full queue drains in well under
a second (measured: 64 queued steps and a flush in ~0.1 s on a 2-core machine); ten seconds
covers a slow disk and still bounds a hung file system."""


class HeldInterrupts:
    """Context manager: SIGINT is held (counted) in the main thread while the block runs."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.grace_s = grace_s
        self.count = 0
        self._deadline: float | None = None
        self._prev: Any = None
        self._installed = False

    def __enter__(self) -> HeldInterrupts:
        if threading.current_thread() is threading.main_thread():
            try:
                self._prev = signal.getsignal(signal.SIGINT)
                signal.signal(signal.SIGINT, self._hold)
                self._installed = True
            except (ValueError, OSError, TypeError):
                self._installed = False
        return self

    def _hold(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self._deadline is None:
            self._deadline = time.monotonic() + self.grace_s
            _say(f"tracealyze: interrupted while saving the run; finishing (at most "
                 f"{self.grace_s:.0f} s more)")

    @property
    def expired(self) -> bool:
        """True once a held interrupt's grace period has run out."""
        return self._deadline is not None and time.monotonic() >= self._deadline

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self._installed:
            return
        try:
            if signal.getsignal(signal.SIGINT) == self._hold:
                signal.signal(signal.SIGINT, self._prev)
        except (ValueError, OSError, TypeError):
            return

    def deliver(self, *, unless_exiting: bool) -> None:
        """Hand a held interrupt to the handler that was there before (by default: raise
        ``KeyboardInterrupt``), unless ``unless_exiting`` and an exception is being handled."""
        if not self.count or not callable(self._prev):
            return
        if unless_exiting and sys.exc_info()[1] is not None:
            return
        self.count = 0
        self._prev(signal.SIGINT, None)


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except Exception:  # a closed stderr must not stop the save
        pass


def say_gave_up(grace_s: float) -> None:
    _say(f"tracealyze: the writer did not finish within {grace_s:.0f} s of the second "
         "interrupt; steps not yet written are lost (what was written is kept)")
