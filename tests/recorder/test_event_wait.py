"""The writer waits for a step's CUDA event asleep: one ``query()`` when the GPU is past it,
else the blocking-sync event's ``synchronize()`` (the driver puts the thread to sleep), never
a polling loop whose every wake takes the GIL from the training thread."""

from __future__ import annotations

import inspect

from tracealyze.recorder import capture
from tracealyze.recorder.write import devwait


class FakeEvent:
    def __init__(self, done: bool) -> None:
        self.done = done
        self.queries = 0
        self.syncs = 0

    def query(self) -> bool:
        self.queries += 1
        return self.done

    def synchronize(self) -> None:
        self.syncs += 1
        self.done = True


def test_a_passed_event_costs_one_query_and_no_wait() -> None:
    ev = FakeEvent(done=True)
    devwait.wait_for(ev)
    assert (ev.queries, ev.syncs) == (1, 0)


def test_a_pending_event_is_waited_for_once_not_polled() -> None:
    ev = FakeEvent(done=False)
    devwait.wait_for(ev)
    assert (ev.queries, ev.syncs) == (1, 1)


def test_the_step_event_is_a_blocking_sync_one() -> None:
    # A default event's synchronize() spins a CPU core for as long as the GPU is behind;
    # only a blocking-sync event sleeps. (pack's CUDA branch cannot run without a GPU.)
    src = inspect.getsource(capture.pack)
    assert "torch.cuda.Event(blocking=True)" in src
