"""The first real GPU runs (issue 44; ../shared/gpu-runs, recorded on an H200): what the
analyzer concludes from them must be what is true of them (their README).

* ``gpu_transformer``: healthy, launch-bound; AdamW reads each parameter's CPU ``step`` with
  ``.item()`` (108 a step), which waits for nothing: no ``host_sync`` above info, and the
  idle GPU is not "a consequence of host_sync".
* ``gpu_host_sync``: one real host wait per step, at ``aten::item`` (a CUDA loss read with
  ``.item()``: a device-to-host copy, then a stream synchronize).
"""

from __future__ import annotations

import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.gpuruns import RUNS


class _Summaries(dict):
    """Each run's summary, made when a test first asks (a missing run skips that test)."""

    def __missing__(self, name: str) -> dict:
        self[name] = build_summary(RUNS / name)
        return self[name]


@pytest.fixture(scope="module")
def summaries() -> dict[str, dict]:
    return _Summaries()


def _one(summary: dict, fid: str) -> dict | None:
    found = [f for f in summary["findings"] if f["id"] == fid]
    assert len(found) <= 1, found
    return found[0] if found else None


@pytest.mark.parametrize("name", ["gpu_transformer", "sync_standard"])
def test_adamw_reading_its_cpu_step_is_not_a_host_sync(summaries: dict, name: str) -> None:
    sync = _one(summaries[name], "host_sync")
    assert sync is None or sync["severity"] == "info", sync
    assert sync is None or sync["evidence"]["syncs_per_step"] <= 1


def test_the_loss_item_is_the_one_sync_a_step(summaries: dict) -> None:
    sync = _one(summaries["gpu_host_sync"], "host_sync")
    assert sync is not None
    ev = sync["evidence"]
    assert ev["syncs"] == ev["profiled_steps"] == 2  # one per profiled step
    assert [s["sync"] for s in ev["sites"]] == ["aten::item"]
    assert sync["severity"] == "info"  # ~50 us of a 17 ms step: cheap, named, not alarming


@pytest.mark.parametrize("name", ["gpu_transformer", "gpu_host_sync"])
def test_the_idle_gpu_is_launch_bound_not_a_consequence_of_a_sync(summaries: dict,
                                                                   name: str) -> None:
    idle = _one(summaries[name], "gpu_idle")
    assert idle is not None and idle["evidence"]["idle_pct"] > 80
    ev = idle["evidence"]
    assert ev["cause"] == "launch_bound", ev
    assert idle.get("caused_by") is None
    # the figures behind it: many small kernels a step, each shorter than its launch call
    assert ev["kernels_per_step"] > 500
    assert ev["median_kernel_us"] < ev["median_launch_us"]
    assert "launch" in idle["message"].lower() and "torch.compile" in idle["advice"]
