"""The writer thread sleeps until submit() has queued `wake_every` items, a one-off job
wakes it, or its next flush is due."""

from __future__ import annotations

import time
from pathlib import Path

from tracealyze.recorder.write.writer import Writer


def wait_for(cond, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def _sleeping_writer(tmp_path: Path) -> Writer:
    """A writer whose thread has started its wait: with an hour's flush interval, from now on
    only a submit (or close) can wake it."""
    w = Writer(tmp_path, 0, flush_interval_s=3600.0, flush_rows=10**9, queue_size=100,
               max_buffered_rows=10**9)
    time.sleep(0.2)
    return w


def test_submit_wakes_the_writer_every_wake_every_items(tmp_path: Path) -> None:
    w = _sleeping_writer(tmp_path)
    try:
        seen: list[int] = []
        for i in range(w.wake_every - 1):
            assert w.submit(lambda _w, i=i: seen.append(i))
        time.sleep(0.3)
        assert seen == [] and len(w.queue) == w.wake_every - 1  # still asleep
        w.submit(lambda _w: seen.append(-1))
        assert wait_for(lambda: len(seen) == w.wake_every), seen
        assert seen == [*range(w.wake_every - 1), -1]  # in order, as one drain
    finally:
        w.close()
    assert not w.alive


def test_close_wakes_a_sleeping_writer_and_flushes(tmp_path: Path) -> None:
    w = _sleeping_writer(tmp_path)
    w.submit(lambda wr: wr.event("x", "one item, below wake_every"))
    t0 = time.monotonic()
    w.close()
    assert time.monotonic() - t0 < 5 and not w.alive
    assert list((tmp_path / "events" / "rank=0").glob("part-*.parquet"))


def test_a_one_off_job_wakes_the_writer_at_once(tmp_path: Path) -> None:
    # A profiler trace to compress should not wait behind the next batch of steps.
    w = _sleeping_writer(tmp_path)
    try:
        seen: list[str] = []
        assert w.submit(lambda _w: seen.append("step"))
        time.sleep(0.3)
        assert seen == []  # one step: still asleep
        assert w.submit(lambda _w: seen.append("trace"), "traces", wake=True)
        assert wait_for(lambda: len(seen) == 2), seen
        assert seen == ["step", "trace"]
    finally:
        w.close()
