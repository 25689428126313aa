"""Progress of long commands (``report``, ``fleet``), drawn by tqdm on a terminal and nothing
when stderr is piped or redirected (a log or a CI job gets no bar characters).

Why tqdm rather than our own bar: it sizes itself to the terminal, rate-limits its redraws,
clears its line, and is already what most training scripts print with; rich would bring a
whole rendering stack for one line. Why a thin class around it: ``report`` reports stages
(opened run, findings, charts, ...), not items, and wants no bar at all for a small run (it
appears only after ``delay_s``, even in the middle of a long stage: a timer draws it).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any


def is_terminal(stream: Any) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)())


class Progress:
    """Stages of a long command on ``stream`` (stderr), shown only on a terminal, when
    ``enabled``, and once the work has taken ``delay_s``."""

    def __init__(self, total: int, enabled: bool, stream: Any = None,
                 delay_s: float = 1.0, desc: str = "report") -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and is_terminal(self.stream)
        self._lock = threading.Lock()
        self._bar: Any = None
        self._timer: threading.Timer | None = None
        if not self.enabled:
            return
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc=desc, file=self.stream, delay=delay_s,
                         unit="stage", dynamic_ncols=True, leave=True,
                         bar_format="{desc} {bar} {n_fmt}/{total_fmt} {postfix}")
        self._bar.set_postfix_str("opening run", refresh=False)
        if delay_s > 0:  # a long first stage: the bar appears at delay_s all the same
            self._timer = threading.Timer(delay_s, self._refresh)
            self._timer.daemon = True
            self._timer.start()

    def _refresh(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.refresh()

    def step(self, label: str) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.set_postfix_str(label, refresh=False)
                self._bar.update(1)

    def finish(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            if self._bar is not None:
                self._bar.close()  # (a bar never shown leaves nothing behind)
                self._bar = None


def counter(desc: str, enabled: bool, stream: Any = None
            ) -> tuple[Callable[[int, int], None], Callable[[], None]]:
    """``(show(done, total), close())`` for work counted in items (``fleet``'s runs): a bar
    on a terminal when ``enabled``, nothing otherwise."""
    stream = stream if stream is not None else sys.stderr
    state: dict[str, Any] = {}
    on = enabled and is_terminal(stream)

    def show(done: int, total: int) -> None:
        if not on:
            return
        bar = state.get("bar")
        if bar is None:
            from tqdm import tqdm

            bar = state["bar"] = tqdm(total=total, desc=desc, file=stream, unit="run",
                                      dynamic_ncols=True, leave=True, delay=0.5)
        bar.total = total
        bar.update(done - bar.n)

    def close() -> None:
        bar = state.pop("bar", None)
        if bar is not None:
            bar.close()

    return show, close
