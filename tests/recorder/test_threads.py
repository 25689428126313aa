"""The public calls from several threads (issue N6): 8 threads calling rec.step, rec.event
and rec.watch beside the training loop made the writer fail ('NoneType' object has no
attribute 'numpy') and lost 10 of 896 rows. Every call's row must arrive."""

from __future__ import annotations

import threading
from pathlib import Path

import torch
from rec_helpers import FAST, batches, events, rows, run_json, steps_by_number, tiny_model, train
from tracealyze.recorder import Recorder

THREADS, CALLS, STEPS = 8, 40, 120


def test_eight_threads_beside_the_loop_lose_nothing(run_dir: Path) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = threading.Barrier(THREADS + 1)
    with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:

        def worker(k: int) -> None:
            start.wait()
            for i in range(CALLS):
                rec.event("tick", f"thread {k} call {i}", severity="info", subject=str(k))
                rec.watch(f"w{k}", torch.full((64,), float(i)))
                if k % 2:
                    # not the training thread: joins the open step as a metric
                    rec.step(**{f"side{k}": float(i)})

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
        for t in threads:
            t.start()
        start.wait()
        train(rec, model, opt, batches(STEPS))
        for t in threads:
            t.join()
    meta = run_json(run_dir)
    assert meta["counters"]["recorder_errors"] == 0, events(run_dir, "recorder_error")[:3]
    assert not meta["counters"]["dropped"]
    ticks = events(run_dir, "tick")
    assert len(ticks) == THREADS * CALLS
    assert {e["message"] for e in ticks} == {f"thread {k} call {i}" for k in range(THREADS)
                                             for i in range(CALLS)}
    watched = [r for r in rows(run_dir, "tensor_stats") if r["kind"] == "watch"]
    assert len(watched) == THREADS * CALLS
    steps = steps_by_number(run_dir)  # unique (asserted there) and contiguous
    assert sorted(steps) == list(range(len(steps))) and len(steps) >= STEPS
    assert len(steps) == STEPS  # only the training thread ends steps
    metrics = rows(run_dir, "metrics")
    for k in range(1, THREADS, 2):
        # one value per step and name (the last of the step), in call order, the last kept
        side = [(r["step"], r["value"]) for r in metrics if r["name"] == f"side{k}"]
        values = [v for _, v in sorted(side)]
        assert values == sorted(set(values)) and values[-1] == CALLS - 1, (k, side)
    (note,) = events(run_dir, "step_from_another_thread")
    assert note["severity"] == "info"
