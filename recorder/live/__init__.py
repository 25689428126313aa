"""How the recorder lives in the training process without ever stopping it: one failure count
for every guarded call (``guard``), the process's hooks it installs and puts back (atexit,
excepthook, SIGTERM, fork: ``process_hooks``), Ctrl-C while saving (``interrupts``), and rank,
world size and compute timing under torch.distributed (``dist``)."""

from __future__ import annotations

from .. import lazy_exports

_EXPORTS = {
    "Guard": ".guard",
    "ProcessHooks": ".process_hooks",
    "HeldInterrupts": ".interrupts",
    "rank_and_world": ".dist",
}
"""Public name -> the module that defines it (imported on first use)."""

__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
