"""What the recorder hooks into the process: atexit, the excepthook, SIGTERM, fork and
``warnings.showwarning`` (autograd anomaly tracebacks). Installed once per Recorder and put
back exactly as found at close."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import warnings
import weakref
from typing import Any


class ProcessHooks:
    """Process-wide hooks for one recorder, held through a weak reference (a recorder that
    is garbage collected is never kept alive, nor called, by them)."""

    def __init__(self, rec: Any, *, handle_sigterm: bool) -> None:
        self._ref = weakref.ref(rec)
        ref = self._ref
        self._atexit = lambda: _close(ref)
        atexit.register(self._atexit)
        if hasattr(os, "register_at_fork"):
            # A forked child (DataLoader worker, ...) inherits the recorder, its SIGTERM
            # handler and excepthook, but not the writer thread, and the run is the
            # parent's: make the child's copy inert so it never writes or closes the run.
            os.register_at_fork(after_in_child=lambda: _inert(ref))
        self._prev_excepthook = prev_hook = sys.excepthook

        def excepthook(tp: Any, val: Any, tb: Any) -> None:
            r = ref()
            if r is not None and not r._closed:
                r._record_exception(val)
                r._shutdown("crashed", deliver=False)
            prev_hook(tp, val, tb)

        sys.excepthook = self._excepthook = excepthook
        self._prev_sigterm: Any = None
        self._in_sigterm = False
        if handle_sigterm and threading.current_thread() is threading.main_thread():
            try:
                self._prev_sigterm = signal.getsignal(signal.SIGTERM)
                signal.signal(signal.SIGTERM, self._on_sigterm)
            except (ValueError, OSError):
                self._prev_sigterm = None
        self._prev_showwarning = prev_show = warnings.showwarning

        def showwarning(message: Any, category: Any, filename: str, lineno: int,
                        file: Any = None, line: Any = None) -> None:
            r = ref()
            text = str(message)
            window = getattr(getattr(r, "_life", None), "anomaly", None)
            # autograd.detect_anomaly's forward traceback of the op that made NaN (while
            # an after_nonfinite window is open, its own event says it: anomaly.py)
            if (r is not None and not r._closed and "Error detected in" in text
                    and (window is None or not window.active)):
                subject = text.split("Error detected in", 1)[1].split(".")[0].strip()
                r.event("anomaly", text.splitlines()[0], severity="error",
                        subject=subject, stack=text)
            prev_show(message, category, filename, lineno, file, line)

        warnings.showwarning = self._showwarning = showwarning

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self._in_sigterm:
            # A second SIGTERM (a pod's and a forwarder's) while the first closes the run:
            # the first one ends the process once the run is saved.
            return
        self._in_sigterm = True
        r = self._ref()
        if r is not None:
            r.event("signal", "received SIGTERM; closing the run", severity="warning",
                    subject="SIGTERM")
            r._shutdown("crashed", deliver=False)
        self._in_sigterm = False
        prev = self._prev_sigterm
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_IGN:
            return
        else:  # default action: terminate as if we had not been here
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    def remove(self) -> None:
        """Put back what was there (only where nobody replaced our hook since)."""
        if sys.excepthook is self._excepthook:
            sys.excepthook = self._prev_excepthook
        if warnings.showwarning is self._showwarning:
            warnings.showwarning = self._prev_showwarning
        if self._prev_sigterm is not None:
            try:
                if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                    signal.signal(signal.SIGTERM, self._prev_sigterm)
            except (ValueError, OSError):
                pass
        try:
            atexit.unregister(self._atexit)
        except Exception:
            pass


def _close(ref: weakref.ref[Any]) -> None:
    r = ref()
    if r is not None:
        r._shutdown(None, deliver=False)


def _inert(ref: weakref.ref[Any]) -> None:
    r = ref()
    if r is not None:
        if getattr(r, "_life", None) is not None:  # the child's copy of the open run: inert
            r._life.closed = True
        lock = getattr(getattr(r, "_rundir", None), "lock", None)
        if lock is not None:  # the child's copy of the descriptor, not the parent's lock
            lock.release(remove=False)
