"""Rank and world size, from torch.distributed or the launcher's environment; the hooks
that time a rank's own compute."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def rank_and_world() -> tuple[int, int]:
    """(rank, world_size): torch.distributed if initialised, else RANK/WORLD_SIZE, else (0, 1)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1


def watch_compute(named_params: list[tuple[str, Any]], landed: Callable[[Any], None]
                  ) -> list[Any]:
    """Distributed data parallel: the all-reduce makes every rank's step as long as the
    slowest's, so a straggler is invisible in step times. What differs is each rank's own
    work before it waits: from its batch's arrival to its last gradient. Backward produces
    the first parameters' gradients last (they are used first in the forward), so a
    host-time hook (``landed``) on the first few marks the end of the rank's backward
    compute (before DDP's final wait for the all-reduce). On GPUs this is launch time, not
    kernel time. Returns the hook handles."""
    import torch

    if not hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
        return []
    first = [p for _, p in named_params if p.requires_grad][:4]
    return [p.register_post_accumulate_grad_hook(landed) for p in first]
