"""The heap counter (glibc mallinfo2) stays on the training thread, at the step boundary,
unless it proved slow in a CUDA run: then the writer thread reads it (the snapshot fills
a None in), and the memory rows still carry it."""

from __future__ import annotations

import pytest
from tracealyze.recorder.training.sampler import MemoryProbe

pytestmark = pytest.mark.skipif(MemoryProbe._mallinfo is None, reason="needs glibc")


def test_a_cpu_run_always_reads_it_at_commit() -> None:
    probe = MemoryProbe(None)
    probe.SLOW_HEAP_S = -1.0  # however slow: a CPU run's heap moves within a step
    assert all(probe.heap_at_commit() is not None for _ in range(40))
    assert not probe.heap_on_writer


def test_a_slow_read_in_a_cuda_run_moves_to_the_writer() -> None:
    probe = MemoryProbe(None)
    probe.cuda = True  # (no CUDA needed: only the decision is under test)
    probe.SLOW_HEAP_S = -1.0
    reads = [probe.heap_at_commit() for _ in range(40)]
    n = MemoryProbe._HEAP_SAMPLES
    assert all(r is not None for r in reads[:n]) and reads[n:] == [None] * (40 - n)
    assert probe.heap_on_writer
    probe.cuda = False  # (snapshot without the CUDA counters)
    assert probe.snapshot(rss=1, heap=None)["heap_bytes"] > 0  # the writer's read


def test_a_cheap_read_in_a_cuda_run_stays() -> None:
    probe = MemoryProbe(None)
    probe.cuda = True
    probe.SLOW_HEAP_S = 10.0
    assert all(probe.heap_at_commit() is not None for _ in range(40))
    assert not probe.heap_on_writer
