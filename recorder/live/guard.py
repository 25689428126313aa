"""How a recorder failure is handled, wherever it happens (the training thread, the writer
thread): counted, said once per kind on stderr, and kept as a ``recorder_error`` event.
Telemetry never stops training: a guarded call that fails returns None."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any


class Guard:
    """One per Recorder, shared with its writer: one count of failures (run.json's
    ``recorder_errors``) and one set of kinds already said."""

    def __init__(self) -> None:
        self.errors = 0
        self._said: set[str] = set()
        # reentrant: a signal handler that closes the recorder runs on the thread it
        # interrupted, which may hold this lock
        self._lock = threading.RLock()

    def once(self, key: str) -> bool:
        """True the first time ``key`` is seen: say it then, count the rest silently."""
        with self._lock:
            if key in self._said:
                return False
            self._said.add(key)
            return True

    def failed(self, where: str, exc: BaseException) -> None:
        """Count a failure in ``where``; the first of its kind is said on stderr."""
        with self._lock:
            self.errors += 1
        if self.once(f"{where}:{type(exc).__name__}"):
            print(f"tracealyze: recorder error in {where} ({type(exc).__name__}: {exc}); "
                  "training continues, further errors of this kind are only counted",
                  file=sys.stderr)

    def call(self, where: str, fn: Callable[..., Any], *args: Any,
             record: Callable[[str, BaseException], None] | None = None) -> Any:
        """``fn(*args)``; on an exception: counted, said once, ``record(where, exc)`` keeps
        it (as an event), and None is returned."""
        try:
            return fn(*args)
        except Exception as exc:
            self.failed(where, exc)
            if record is not None:
                try:
                    record(where, exc)
                except Exception:
                    pass
            return None
