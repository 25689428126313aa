"""Every parameter accounted for: it got a gradient, it is frozen, it is outside the
optimizer, or it is trainable, in the optimizer, and never got a gradient (a ``.detach()``
or ``torch.no_grad()`` cutting the graph, a branch the forward never takes).

The gradient reader already collects every parameter's ``.grad`` reference at its cadence
(host-side attribute reads, no device work). :class:`Coverage` keeps, per parameter, whether
it ever had one, and writes a ``param_coverage`` event (info) the first time and whenever that
set grows: a handful of events in a run, each listing only the parameters that are *not*
plainly fine (never a gradient, frozen, outside the optimizer), by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

MAX_NAMES = 4096
"""Names listed per state (a frozen backbone can have thousands: the counts stay exact)."""


class Coverage:
    """Per-parameter gradient coverage of one model (see the module docstring)."""

    def __init__(self, named: list[tuple[str, nn.Parameter]],
                 optimizer: Callable[[], Any],
                 emit: Callable[[str, dict[str, Any]], None]) -> None:
        """``optimizer()`` gives the torch optimizer when known (None: unknown, e.g. found
        later); ``emit(message, details)`` writes the event."""
        self.named = named
        self.optimizer = optimizer
        self.emit = emit
        self.ever: list[bool] | None = None

    def seen(self, present: list[bool]) -> None:
        """Which parameters hold a gradient now (called when that set changes)."""
        ever = list(present) if self.ever is None else [
            a or b for a, b in zip(self.ever, present, strict=True)]
        if ever == self.ever:
            return
        self.ever = ever
        d = self.details(ever)
        c = d["counts"]
        self.emit(f"{d['with_grad']} of {d['parameters']} parameters got a gradient so far; "
                  f"{c['no_grad']} trainable without one, {c['frozen'] + c['frozen_in_optimizer']}"
                  f" frozen, {c['not_in_optimizer']} trainable outside the optimizer", d)

    def details(self, ever: list[bool]) -> dict[str, Any]:
        opt = self.optimizer()
        in_opt: set[int] | None = None
        if opt is not None:
            in_opt = {id(p) for g in opt.param_groups for p in g.get("params", ())}
        groups: dict[str, list[str]] = {"no_grad": [], "frozen": [], "not_in_optimizer": [],
                                        "frozen_in_optimizer": []}
        numel = dict.fromkeys(groups, 0)
        counts = dict.fromkeys(groups, 0)
        with_grad = 0
        for (name, p), got in zip(self.named, ever, strict=True):
            listed = in_opt is None or id(p) in in_opt
            states = []
            if not p.requires_grad:
                states.append("frozen_in_optimizer" if in_opt is not None and listed
                              else "frozen")
            else:
                if not listed:
                    states.append("not_in_optimizer")
                if not got:
                    states.append("no_grad")
            with_grad += bool(got)
            for s in states:
                counts[s] += 1
                numel[s] += p.numel()
                if len(groups[s]) < MAX_NAMES:
                    groups[s].append(name)
        return {"parameters": len(self.named), "with_grad": with_grad,
                "optimizer_known": in_opt is not None, **groups,
                "counts": counts, "numel": numel}
