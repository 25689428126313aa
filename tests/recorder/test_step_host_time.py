"""Per-step host figures (``steps.cpu_s``, ``steps.cpu_queue_s``): where a step's wall time
went — the process's CPU, the training thread's wait for a free CPU — and a step of gradient
accumulation timed over all its micro-batches."""

from __future__ import annotations

import sys
import time

import pytest
import torch
from tracealyze.recorder import Recorder

from tests.recorder.rec_helpers import (
    FAST,
    batches,
    loss_fn,
    run_script,
    steps_by_number,
    tiny_model,
    write_script,
)


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_cpu_work_and_idle_time_are_told_apart(tmp_path):
    """A step that computes for 0.2 s shows that CPU time; one that sleeps 0.2 s shows
    neither CPU nor run-queue time for it (it was blocked, not waiting for a CPU)."""
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ((x, y),) = batches(1)
    with Recorder(tmp_path / "run", model=model, optimizer=opt, **FAST) as rec:
        for i in range(8):
            loss = loss_fn(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i == 3:
                _spin(0.2)
            if i == 5:
                time.sleep(0.2)
            rec.step(loss=loss)
    st = steps_by_number(tmp_path / "run")
    assert st[3]["cpu_s"] >= 0.19 and st[3]["duration_s"] >= 0.2
    assert st[5]["duration_s"] >= 0.2 and st[5]["cpu_s"] < 0.1
    if sys.platform.startswith("linux"):
        assert all(st[s]["cpu_queue_s"] is not None for s in st)
        # the sleep did not wait in the run queue: whatever it waited (a loaded machine) is
        # the step's small compute, far below the 0.2 s it slept
        assert st[5]["cpu_queue_s"] < 0.1
    else:
        assert all(st[s]["cpu_queue_s"] is None for s in st)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux schedstat")
def test_a_thread_kept_off_its_cpu_by_another_process_shows_in_the_queue(tmp_path):
    """The training and a busy competitor pinned to one CPU (another job on the machine):
    a step of 0.3 s of CPU work waits about as long again in the run queue."""
    script = write_script(tmp_path, "pinned.py", f"""
        import os, subprocess, sys, time
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {{cpu}})  # before torch starts its threads: they inherit it
        import torch
        from tracealyze.recorder import Recorder
        from rec_helpers import FAST, loss_fn, tiny_model
        torch.set_num_threads(1)
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                               preexec_fn=lambda: os.sched_setaffinity(0, {{cpu}}))
        try:
            model = tiny_model()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            x, y = torch.randn(5, 4), torch.randn(5, 2)
            with Recorder({str(tmp_path / "run")!r}, model=model, optimizer=opt,
                          **FAST) as rec:
                for i in range(5):
                    loss = loss_fn(model, x, y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    if i == 3:
                        end = time.process_time() + 0.3
                        while time.process_time() < end:
                            pass
                    rec.step(loss=loss)
        finally:
            hog.kill()
    """)
    proc = run_script(script)
    assert proc.returncode == 0, proc.stderr[-2000:]
    st = steps_by_number(tmp_path / "run")[3]
    assert st["cpu_s"] >= 0.29
    # sharing one CPU with a busy process: about half the step's wall time in the queue
    assert st["cpu_queue_s"] >= 0.1, st
    assert st["duration_s"] >= st["cpu_s"] + 0.1


def test_a_step_of_accumulated_micro_batches_lasts_all_of_them(tmp_path):
    """rec.step() after each of 4 micro-batches, the optimizer after the last: one recorded
    step whose duration and CPU time cover the four, not the last one only."""
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ((x, y),) = batches(1)
    with Recorder(tmp_path / "run", model=model, optimizer=opt, **FAST) as rec:
        for _ in range(3):
            opt.zero_grad()
            for m in range(4):
                loss = loss_fn(model, x, y) / 4
                loss.backward()
                _spin(0.03)
                if m == 3:
                    opt.step()
                rec.step(loss=loss)
    st = steps_by_number(tmp_path / "run")
    assert sorted(st) == [0, 1, 2]
    for s in st.values():
        assert s["duration_s"] >= 0.12 and s["cpu_s"] >= 0.11, s
