"""The real trace fixtures of tests/data/traces, for analyzer tests."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data" / "traces"


def sampled_trace() -> Path:
    """HTA's sampled rank-0 trace of a 128-rank NCCL job (2 profiled steps, 1154 kernels)."""
    return DATA / "gpu_sampled_rank0.json.gz"
