"""The writer thread sleeps until submit() has queued `wake_every` items (or its timeout)."""

from __future__ import annotations

import time
from pathlib import Path

from tracealyze.recorder.writer import Writer


def wait_for(cond, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_submit_wakes_the_writer_every_wake_every_items(tmp_path: Path) -> None:
    w = Writer(tmp_path, 0, flush_interval_s=3600.0, flush_rows=10**9, queue_size=100,
               max_buffered_rows=10**9)
    try:
        w.max_wait_s = 3600.0  # from the next wait on, only a submit can wake it
        time.sleep(0.8)  # past the first (0.5 s) wait
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
    w = Writer(tmp_path, 0, flush_interval_s=3600.0, flush_rows=10**9, queue_size=100,
               max_buffered_rows=10**9)
    w.max_wait_s = 3600.0
    time.sleep(0.8)
    w.submit(lambda wr: wr.event("x", "one item, below wake_every"))
    t0 = time.monotonic()
    w.close()
    assert time.monotonic() - t0 < 5 and not w.alive
    assert list((tmp_path / "events" / "rank=0").glob("part-*.parquet"))
