"""The recorder's run.json: the format's skeleton (``tracealyze.format.runmeta``) filled
with what only the training process knows (torch and CUDA versions)."""

from __future__ import annotations

from typing import Any

from tracealyze.format.parts import write_json_atomic
from tracealyze.format.runmeta import new_rank_meta, read_json
from tracealyze.format.runmeta import new_run_meta as _format_run_meta

try:  # the distribution's version, when installed
    from importlib.metadata import version as _dist_version

    TRACEALYZE_VERSION = _dist_version("tracealyze")
except Exception:  # pragma: no cover - running from a source tree
    TRACEALYZE_VERSION = "0+unknown"

__all__ = ["new_run_meta", "rank_meta", "read_json", "write_json_atomic"]

rank_meta = new_rank_meta


def new_run_meta(*, preset: str, knobs: dict[str, Any], world_size: int,
                 model: dict[str, Any] | None, device: dict[str, Any] | None,
                 flush_interval_s: float) -> dict[str, Any]:
    import torch

    return _format_run_meta(
        preset=preset, knobs=knobs, world_size=world_size, model=model, device=device,
        flush_interval_s=flush_interval_s,
        versions={"torch": torch.__version__, "tracealyze": TRACEALYZE_VERSION,
                  "cuda": torch.version.cuda})
