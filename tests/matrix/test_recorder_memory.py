"""The recorder's own work is never a finding (#26): healthy runs under the standard preset's
default profiler window (step 50), each in a fresh process as a user's job would be, have no
memory_leak finding (5 of 5 in the suite, one seed per architecture; 20 of 20 with
``TRACEALYZE_FULL_MATRIX=1``, the seeds 1-4 that benchmarks/matrix.py also records as the
``healthy_profiled`` cell); and the discount the leak detector applies is exactly the level a
window's profiler kept."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.matrix.test_matrix import run_jobs
from tests.recorder.rec_helpers import events
from tests.scenarios import checks

MODELS = ("gru", "lstm", "vit", "resnet", "gpt2")
# Each run is a fresh ~10 s process: the suite's budget (issue 43) holds one seed per
# architecture, which is what catches a recorder that leaves its window's memory behind.
SEEDS = (1, 2, 3, 4) if os.environ.get("TRACEALYZE_FULL_MATRIX") else (1,)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_default_profiler_window_is_not_a_leak_in_fresh_processes(tmp_path: Path):
    todo = [[f"{m}:healthy_profiled:{s}"] for m in MODELS for s in SEEDS]
    assert len(todo) == len(MODELS) * len(SEEDS)
    assert not run_jobs(tmp_path, todo)
    leaks = []
    for m in MODELS:
        for s in SEEDS:
            run = tmp_path / f"{m}-healthy_profiled-s{s}"
            summary = checks.summarize(run)
            # the window really ran (and wrote its trace)
            assert list((run / "traces").rglob("*.pt.trace.json.gz")), run
            assert [e for e in events(run, "profiler_window")], run
            leaks += [f"{run.name}: {f['title']}" for f in checks.by_id(summary, "memory_leak")]
    assert not leaks, leaks


def test_discount_removes_the_profilers_step_and_keeps_a_leak():
    from tracealyze.analyzer.diagnosis.detectors.memory_leak import discount

    step = np.arange(300)
    flat = np.full(300, 100e6) + np.where(step >= 50, 20e6, 0.0)  # the window kept 20 MB
    s, v = discount(step, flat, [(49, 51)])
    assert not ((s >= 49) & (s <= 61)).any()
    assert np.ptp(v) < 1.0  # (flat to the byte: the trend is a least-squares fit)
    leak = flat + np.where(step >= 100, (step - 100) * 50e3, 0.0)  # and a leak from 100
    s, v = discount(step, leak, [(49, 51)])
    assert v[-1] - v[0] == pytest.approx(199 * 50e3)
