"""Rows whose write failed are kept as the batches they were buffered in, so the byte bound
drops the oldest rows of the bulkiest table and every table keeps its newest. (Each retry
joins every held row into one table: put back whole, "the oldest batch" was all of them, and
a disk full for a few flushes lost the newest steps too.)"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np
from tracealyze.recorder.write.buffers import TableBuffer
from tracealyze.recorder.write.writer import Writer


def _fail_flushes(buf: TableBuffer, batches: list[range]) -> None:
    """Each batch appended, then one flush whose write fails (take, put back)."""
    for steps in batches:
        buf.append({"rank": np.zeros(len(steps), np.int32),
                    "step": np.asarray(steps, np.int64)}, len(steps))
        table = buf.take()
        assert table is not None
        buf.put_back(table)


def _kept_steps(buf: TableBuffer) -> list[int]:
    return [s for t in buf.failed for s in t.column("step").to_pylist()]


def test_a_failed_write_goes_back_as_the_batches_it_joined() -> None:
    buf = TableBuffer("steps")
    _fail_flushes(buf, [range(0, 10), range(10, 15), range(15, 40)])
    assert [t.num_rows for t in buf.failed] == [10, 5, 25]
    assert _kept_steps(buf) == list(range(40)) and buf.rows == 40
    assert buf.drop_oldest(30) == 10
    assert _kept_steps(buf) == list(range(10, 40))


def test_the_bound_drops_the_oldest_rows_and_keeps_the_newest() -> None:
    steps, stats = TableBuffer("steps"), TableBuffer("memory")
    for lo in range(0, 80, 8):  # ten failed flushes of 8 steps each
        _fail_flushes(steps, [range(lo, lo + 8)])
        _fail_flushes(stats, [range(lo, lo + 8)])
    one = sum(t.nbytes for t in steps.failed[:1]) + sum(t.nbytes for t in stats.failed[:1])
    w = SimpleNamespace(buffers={"steps": steps, "memory": stats}, dropped=Counter(),
                        max_buffered_bytes=3 * one, max_buffered_rows=10**9)
    Writer._bound_failed(w)  # type: ignore[arg-type]
    held = sum(t.nbytes for b in (steps, stats) for t in b.failed)
    assert held <= 3 * one
    kept = _kept_steps(steps)
    assert kept and kept[-1] == 79 and kept == list(range(kept[0], 80)), kept
    assert w.dropped["steps"] == kept[0] and w.dropped["memory"] > 0
    mem = _kept_steps(stats)
    assert mem and mem == list(range(mem[0], 80)), mem
