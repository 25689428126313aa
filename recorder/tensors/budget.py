"""Keeps the every-step gradient norms within a share of the step time.

Reading every gradient once per step is nearly free on an accelerator (one fused kernel, a
few microseconds of launch), but on a CPU or a slow host it is a memory pass over all
gradients on the training thread: ~1.1 ms of a 42 ms step for 3.2M float32 gradients on one
core, 2.6% by itself. :class:`NormBudget` measures what the norms cost on the training thread
(host time, ``perf_counter``: no device sync) against the step period and, when they cost
more than ``budget`` of it (and more than ``MIN_COST_S``), reads them every 2nd, 4th, ...
step (a power of two, at most ``MAX_STRIDE``) so that the average fits. When they get
cheaper again the stride comes back down. The recorder writes an ``info`` event each time
the stride changes, so the gaps in ``steps.grad_norm`` are explained in the run itself.

The stride must not flap. On an H200 a read cost 0.49-0.51 ms against a 0.5 ms floor
(``MIN_COST_S``), and the stride went 1 → 8 → 1 six times in 300 steps, an event each time.
So every boundary has hysteresis: a read is spread once it costs ``MIN_COST_S``, and comes
back to every step only below ``_DOWN`` of it (as a stride halves only when the cost fits
the smaller one with that margin); and after a change the next waits for ``_WINDOW`` fresh
reads, so the medians it decides on describe the new cadence, not the old one.
"""

from __future__ import annotations

import statistics
from collections import deque

MAX_STRIDE = 64
# Costs and periods are the median of the last _WINDOW observations: a read that the OS
# preempted (10 ms on a busy host) must not spread the norms by itself. The first _SKIP
# reads are not counted at all (they build the plan, allocate and warm caches).
_WINDOW = 9
_SKIP = 2
_DOWN = 0.7  # come back down only when the cost fits the smaller stride with this margin
# A read cheaper than this is never spread, whatever the step time: a small model's read
# (tens of microseconds, a few hundred on a loaded host) costs about what the rest of
# rec.step() does, and gaps would buy nothing.
MIN_COST_S = 5e-4


class NormBudget:
    """Stride of the per-step gradient norms under a budget (0 = always stride 1)."""

    def __init__(self, budget: float, every: int = 1, *, window: int = _WINDOW,
                 skip: int = _SKIP, what: str = "reading the gradient norms") -> None:
        """``every``: the configured cadence (``grad_norm_every``); the stride multiplies it.
        ``window``/``skip``: reads a decision takes the median of / first reads not counted
        (histograms, read every 100 steps, decide on 3 after 1); ``what``: the event's
        subject."""
        self.budget = budget
        self.every = max(every, 1)
        self.stride = 1
        self.what, self.window, self.skip = what, window, skip
        self.cost_s: float | None = None  # median host time of one read
        self.period_s: float | None = None  # median step period
        self._costs: deque[float] = deque(maxlen=window)
        self._periods: deque[float] = deque(maxlen=_WINDOW)
        self._seen = 0
        self._since_change = 0  # reads charged since the stride last changed

    def cadence_event(self) -> tuple[str, dict[str, object]]:
        """The ``grad_norm_cadence`` event's message and details for the current stride
        (a stride changes only once both medians exist)."""
        cost, period = self.cost_s or 0.0, self.period_s or 1.0
        every = self.every * self.stride
        return (f"{self.what} took {cost / period:.1%} of the step "
                f"({cost * 1e3:.2f} ms of {period * 1e3:.1f} ms; budget {self.budget:.1%}): "
                f"now every {every} step{'s' if every > 1 else ''}",
                {"every": every, "cost_s": self.cost_s, "step_s": self.period_s})

    def step_period(self, seconds: float) -> None:
        """One optimizer step's period (between two gradient captures). Every step: only
        kept here; the median is taken when a read is charged."""
        if seconds > 0:
            self._periods.append(seconds)

    def read_cost(self, seconds: float) -> int | None:
        """One read of the norms took ``seconds``; the new stride if it changes, else None."""
        self._seen += 1
        if self._seen <= self.skip:
            return None
        self._costs.append(seconds)
        self._since_change += 1
        self.cost_s = statistics.median(self._costs)
        self.period_s = statistics.median(self._periods) if self._periods else None
        if (self.budget <= 0 or len(self._costs) < self.window or not self.period_s
                or self._since_change < self.window):
            return None
        # Needed stride: how many cadences one read must be spread over to fit the budget.
        floor = MIN_COST_S if self.stride == 1 else MIN_COST_S * _DOWN
        need = (0.0 if self.cost_s < floor
                else self.cost_s / (self.budget * self.period_s * self.every))
        stride = self.stride
        while need > stride and stride < MAX_STRIDE:
            stride *= 2
        while stride > 1 and need < (stride // 2) * _DOWN:
            stride //= 2
        if stride == self.stride:
            return None
        self.stride = stride
        self._since_change = 0
        return stride

