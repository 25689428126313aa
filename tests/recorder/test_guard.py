"""The Guard: one way to handle a recorder failure on every thread."""

from __future__ import annotations

import pytest
from tracealyze.recorder.live.guard import Guard
from tracealyze.recorder.write.writer import Writer


def test_a_failure_is_counted_said_once_per_kind_and_recorded(capsys) -> None:
    g = Guard()
    kept = []

    def boom(x: int) -> int:
        raise ValueError(f"bad {x}")

    assert g.call("stats", boom, 1, record=lambda w, e: kept.append((w, str(e)))) is None
    assert g.call("stats", boom, 2, record=lambda w, e: kept.append((w, str(e)))) is None
    assert g.call("stats", lambda: 7) == 7
    g.failed("writer", OSError("disk"))
    assert g.errors == 3
    assert kept == [("stats", "bad 1"), ("stats", "bad 2")]
    err = capsys.readouterr().err
    assert err.count("recorder error in stats") == 1 and "recorder error in writer" in err


def test_a_failing_record_never_raises_into_training() -> None:
    g = Guard()

    def record(_w: str, _e: BaseException) -> None:
        raise RuntimeError("event sink broken")

    assert g.call("x", lambda: 1 / 0, record=record) is None
    assert g.errors == 1


def test_once_is_true_only_the_first_time() -> None:
    g = Guard()
    assert [g.once("step_values") for _ in range(3)] == [True, False, False]


@pytest.mark.parametrize("shared", [True, False])
def test_the_writer_counts_into_the_recorders_guard(tmp_path, shared) -> None:
    g = Guard()
    w = Writer(tmp_path, 0, flush_interval_s=3600.0, flush_rows=10**9, queue_size=10,
               max_buffered_rows=10**6, guard=g if shared else None)
    try:
        w.record_error("convert:steps", ValueError("x"))
        assert w.errors == 1
        assert g.errors == (1 if shared else 0)
    finally:
        w.close()
