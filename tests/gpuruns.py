"""Where the real H200 runs are, for the tests that read them (issue 44): the copies shipped
in sample_traces/ (gpu_transformer, gpu_host_sync, gpu_oom_leak), else ../shared/gpu-runs
(which also holds sync_standard)."""

from __future__ import annotations

from pathlib import Path

import pytest

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "gpu-runs"


class _Runs:
    """``RUNS / name``: the run's folder; a test of a run that is in neither place is
    skipped."""

    def __truediv__(self, name: str) -> Path:
        for root in (SAMPLES, SHARED):
            if (root / name / "run.json").is_file():
                return root / name
        pytest.skip(f"{name}: not in sample_traces/ nor ../shared/gpu-runs")


RUNS = _Runs()
