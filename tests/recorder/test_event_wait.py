"""The writer waits for a step's CUDA event asleep (polling), never spinning in
``synchronize()``: on a GPU that spin burnt ~1 ms of a CPU core per step."""

from __future__ import annotations

import itertools

from tracealyze.recorder.write import devwait as rows


class FakeEvent:
    def __init__(self, pending: int) -> None:
        self.pending = pending
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        if self.pending:
            self.pending -= 1
            return False
        return True

    def synchronize(self) -> None:
        raise AssertionError("a spinning wait on the writer thread")


def test_a_done_event_costs_one_query_and_no_sleep() -> None:
    naps: list[float] = []
    ev = FakeEvent(0)
    rows.wait_for(ev, naps.append)
    assert ev.queries == 1 and naps == []


def test_a_pending_event_is_polled_with_growing_capped_sleeps() -> None:
    naps: list[float] = []
    ev = FakeEvent(8)
    rows.wait_for(ev, naps.append)
    assert ev.queries == 9 and len(naps) == 8
    assert naps[0] == rows.POLL_FIRST_S
    assert all(b == min(2 * a, rows.POLL_MAX_S) for a, b in itertools.pairwise(naps))
    assert max(naps) == rows.POLL_MAX_S
