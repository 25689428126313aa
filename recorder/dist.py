"""Rank and world size, from torch.distributed or the launcher's environment."""

from __future__ import annotations

import os


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
