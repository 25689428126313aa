"""The recorder's own memory in the heap figures: the profiler window's events are freed when
the window closes (not at a garbage collection hundreds of steps later, a drop a leak check
would read as the training's), and the rows buffered for the next flush are written beside
the heap (``memory.recorder_heap_bytes``), so the training's heap can be read net of them."""

from __future__ import annotations

import gc
import sys
import time

import pytest
import torch
from torch import nn
from tracealyze.recorder import Recorder
from tracealyze.recorder.training.sampler import MemoryProbe

from tests.recorder.rec_helpers import FAST, steps_by_number

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or MemoryProbe._mallinfo is None,
    reason="glibc mallinfo2")


def _wait_for(cond, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def _heap_rows(run) -> dict[int, dict]:
    import pyarrow.parquet as pq

    t = pq.read_table(run / "memory").to_pylist()
    return {r["step"]: r for r in t}


def test_a_collection_after_the_profiler_window_frees_nothing_of_the_recorders(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(8)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64)
    knobs = {**FAST, "profile_start": 5, "profile_warmup": 1, "profile_active": 2,
             "memory_every": 1}
    gc.disable()  # (no collection but the one below: the test's own timing)
    try:
        with Recorder(tmp_path / "run", model=model, optimizer=opt, **knobs) as rec:
            for i in range(24):
                loss = model(x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if i in (3, 20):  # (3: what setting up left; 20: the window's, if any)
                    gc.collect()  # a full collection, as Python runs one some time later
                if i == 12:  # the writer thread has compressed the trace into place: its
                    # buffers (~0.5 MiB, freed when it ends) are not what step 20 measures
                    # (on a loaded machine that took until step 19 once)
                    _wait_for(lambda: any((tmp_path / "run" / "traces").rglob("*.json.gz")))
                rec.step(loss=loss)
    finally:
        gc.enable()
    assert (tmp_path / "run" / "traces").exists(), "the window was profiled"
    mem = _heap_rows(tmp_path / "run")
    # the collection at step 20 finds none of the window's events left to free
    assert mem[20]["heap_bytes"] >= mem[19]["heap_bytes"] - (512 << 10), (
        mem[19]["heap_bytes"], mem[20]["heap_bytes"])


def test_buffered_rows_are_written_beside_the_heap(tmp_path):
    """With no flush due during the run, the rows buffered grow step by step and are counted
    in ``recorder_heap_bytes`` (a few KiB a step: every parameter's statistics)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(6)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(16, 32)
    knobs = {**FAST, "flush_interval_s": 3600, "memory_every": 1, "tensor_stats_every": 1}
    with Recorder(tmp_path / "run", model=model, optimizer=opt, **knobs) as rec:
        for _ in range(200):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    mem = _heap_rows(tmp_path / "run")
    held = [mem[s]["recorder_heap_bytes"] for s in sorted(mem)]
    assert all(h is not None and h >= 0 for h in held)
    assert held[-1] > held[0] and held[-1] > 10_000, held
    assert all(mem[s]["recorder_heap_bytes"] <= mem[s]["heap_bytes"] for s in mem)
    assert steps_by_number(tmp_path / "run")  # the run is whole
