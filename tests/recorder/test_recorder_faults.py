"""Fault injection: the recorder's own failures never reach the training loop, are counted
and reported, and data is kept (and written later) whenever that is possible."""

from __future__ import annotations

import errno
import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import tracealyze.recorder.tensors.gradients as gradients_mod
import tracealyze.recorder.training.sampler as sampler_mod
import tracealyze.recorder.write.rows as rows_mod
import tracealyze.recorder.write.writer as writer_mod
from rec_helpers import (
    FAST,
    batches,
    events,
    run_json,
    steps_by_number,
    tiny_model,
    train,
)
from tracealyze.recorder import Recorder


def make(run_dir: Path, **knobs: Any) -> tuple[Recorder, torch.nn.Module, Any]:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return Recorder(run_dir, model=model, optimizer=opt, **{**FAST, **knobs}), model, opt


def steps(rec: Recorder, model: torch.nn.Module, opt: Any, n: int) -> None:
    train(rec, model, opt, batches(n))


def wait_until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def yank(run_dir: Path, *, replace_with_file: bool = False) -> None:
    """Make the run directory vanish (optionally leaving a plain file in its place) while
    the writer thread keeps writing. rmtree could race with the writer recreating files
    ("Directory not empty"); a rename is atomic and looks the same to the recorder."""
    for attempt in range(100):
        gone = run_dir.with_name(f"{run_dir.name}.gone{attempt}")
        try:
            run_dir.rename(gone)
        except FileNotFoundError:
            pass
        shutil.rmtree(gone, ignore_errors=True)
        if not replace_with_file:
            return
        try:
            with open(run_dir, "x") as fh:  # fails if the writer recreated it meanwhile
                fh.write("not a directory any more")
            return
        except (FileExistsError, IsADirectoryError):
            continue
    raise AssertionError("could not remove the run directory")


def writer_errors(rec: Recorder) -> int:
    return run_counters(rec)["recorder_errors"]


def run_counters(rec: Recorder) -> dict[str, Any]:
    return rec._counters()  # what the next run.json will say


def test_run_dir_replaced_by_a_file_then_restored(run_dir: Path,
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    rec, model, opt = make(run_dir)
    steps(rec, model, opt, 3)
    wait_until(lambda: (run_dir / "steps").exists())
    yank(run_dir, replace_with_file=True)  # every write now fails (even as root)
    after_yank = writer_errors(rec)
    steps(rec, model, opt, 3)
    stderr: list[str] = []

    def write_failed() -> bool:
        # The recorder reports the first failure of each kind on stderr: wait for a failed
        # data write (an empty flush only fails its heartbeat).
        stderr.append(capfd.readouterr().err)
        return "recorder error in write:" in "".join(stderr)

    wait_until(write_failed)
    # A failure while yank raced the writer (a part renamed away mid-write) may have had its
    # event written into a directory the writer recreated and yank then removed: wait for
    # two failures counted after yank, the second from a flush begun with the file in place.
    wait_until(lambda: writer_errors(rec) >= after_yank + 2)
    steps(rec, model, opt, 2)
    run_dir.unlink()  # the disk "comes back": buffered rows must be written after all
    steps(rec, model, opt, 2)
    rec.close()
    got = steps_by_number(run_dir)
    # Steps 0-2 went with the deleted directory; 3-9 were kept in memory through the outage.
    assert set(range(3, 10)) <= set(got)
    meta = run_json(run_dir)
    assert meta["status"] == "completed"
    assert meta["counters"]["recorder_errors"] >= 1
    errs = events(run_dir, "recorder_error")
    assert errs and all(e["severity"] == "error" and e["stack"] for e in errs)
    assert any(e["subject"].startswith("write:") for e in errs)


def test_run_dir_deleted_mid_run_is_recreated(run_dir: Path) -> None:
    rec, model, opt = make(run_dir)
    steps(rec, model, opt, 3)
    # The flush is complete once its heartbeat has written the rank's metadata (the
    # recorder's sign that this directory held its data): the steps dir alone appears
    # mid-flush, and a deletion inside that flush is not detected (a window of one flush's writes).
    wait_until(lambda: (run_dir / "ranks" / "rank=0.json").exists()
               and (run_dir / "steps").exists())
    yank(run_dir)
    steps(rec, model, opt, 4)
    rec.close()
    assert run_json(run_dir)["status"] == "completed"
    assert {3, 4, 5, 6} <= set(steps_by_number(run_dir))
    assert (run_dir / "ranks" / "rank=0.json").exists()
    # ... and it says that the earlier steps are gone: an event, a counter, a finding.
    (ev,) = events(run_dir, "dropped_data")
    assert ev["severity"] == "error" and "deleted" in ev["message"]
    assert json.loads(ev["details"])["lost_parts"] >= 1
    assert run_json(run_dir)["counters"]["dropped"]["run_dir_deleted"] == 1
    from tracealyze.analyzer.diagnosis.summary import build_summary

    (f,) = [f for f in build_summary(run_dir)["findings"] if f["id"] == "dropped_data"]
    assert f["severity"] == "error" and "deleted" in f["message"]


def test_failed_writes_hold_bounded_bytes(run_dir: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """While every write fails, buffered rows are bounded in bytes (max_buffered_bytes), the
    oldest dropped and counted; the newest are written once the disk is back."""
    real = writer_mod.write_parquet_atomic
    full = threading.Event()
    full.set()

    def write(tables: Any, final: Path) -> None:
        if full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        real(tables, final)

    monkeypatch.setattr(writer_mod, "write_parquet_atomic", write)
    rec, model, opt = make(run_dir, param_stats_every=1, tensor_stats_every=1,
                           max_buffered_bytes=20_000)
    try:
        for _ in range(8):
            steps(rec, model, opt, 5)
            time.sleep(0.06)  # a failed flush between batches
        # read on the writer thread, between two of its items: never in the middle of a
        # flush (rows put back, not bounded yet), which a read from here could land in
        got: list[int] = []
        rec._writer.submit(lambda w: got.append(
            sum(t.nbytes for b in w.buffers.values() for t in b.failed)), "events", wake=True)
        wait_until(lambda: bool(got))
        assert got[0] <= 20_000
        assert sum(rec._writer.dropped.values()) > 0
    finally:  # (an open recorder must not outlive its test: its hooks are process-wide)
        full.clear()
        rec.close()
    assert sorted(steps_by_number(run_dir))[-1] == 39  # the newest rows were kept
    dropped = run_json(run_dir)["counters"]["dropped"]
    assert sum(dropped.values()) > 0 and dropped.get("tensor_stats", 0) > 0


def test_disk_full_keeps_rows_and_reports_once(run_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                               capfd: pytest.CaptureFixture[str]) -> None:
    real = writer_mod.write_parquet_atomic
    full = threading.Event()
    full.set()
    failures = []

    def write(tables: Any, final: Path) -> None:
        if full.is_set():
            failures.append(final)
            raise OSError(errno.ENOSPC, "No space left on device")
        real(tables, final)

    monkeypatch.setattr(writer_mod, "write_parquet_atomic", write)
    rec, model, opt = make(run_dir)
    try:
        steps(rec, model, opt, 3)
        wait_until(lambda: len(failures) >= 3)  # several flushes failed
        steps(rec, model, opt, 3)
    finally:
        full.clear()
        rec.close()
    got = steps_by_number(run_dir)
    assert sorted(got) == list(range(6))  # nothing lost: retried at the next flush
    errs = events(run_dir, "recorder_error")
    assert errs and any("No space left" in e["message"] for e in errs)
    assert run_json(run_dir)["counters"]["recorder_errors"] == writer_errors(rec) >= 3
    # Reported on stderr once per kind of failure, not once per flush.
    err = capfd.readouterr().err
    assert err.count("recorder error in write:steps") == 1


def test_writer_item_exception_is_recorded(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def broken_snapshot(self: Any, rss: int | None = None, heap: int | None = None,
                        cuda: dict[str, Any] | None = None, held: int | None = None
                        ) -> dict[str, Any]:
        calls.append(1)
        raise RuntimeError("probe exploded")

    monkeypatch.setattr(sampler_mod.MemoryProbe, "snapshot", broken_snapshot)
    rec, model, opt = make(run_dir, memory_every=2)
    steps(rec, model, opt, 6)
    rec.close()
    assert len(calls) == 3  # steps 0, 2, 4
    assert sorted(steps_by_number(run_dir)) == list(range(6))  # the step rows survive
    errs = events(run_dir, "recorder_error")
    assert len(errs) == 3 and all("probe exploded" in e["message"] for e in errs)
    assert "RuntimeError" in errs[0]["stack"]
    assert run_json(run_dir)["counters"]["recorder_errors"] == 3


def test_training_thread_errors_counted_once(run_dir: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_norms(tensors: list[torch.Tensor], **_: Any) -> torch.Tensor:
        raise RuntimeError("norms exploded")

    # Both the every-step plan and the checked path it falls back to.
    monkeypatch.setattr(gradients_mod, "norms", broken_norms)
    monkeypatch.setattr(gradients_mod.NormPlan, "__call__",
                        lambda self, tensors: broken_norms(tensors))
    rec, model, opt = make(run_dir)
    steps(rec, model, opt, 4)
    assert rec.errors == 4
    rec.close()
    assert sorted(steps_by_number(run_dir)) == list(range(4))
    assert all(s["grad_norm"] is None for s in steps_by_number(run_dir).values())
    errs = events(run_dir, "recorder_error")
    assert len(errs) == 4 and all("norms exploded" in e["message"] for e in errs)
    # One failure, one count — not once by the recorder and again by the writer.
    assert run_json(run_dir)["counters"]["recorder_errors"] == 4


def test_full_queue_drops_and_counts_but_never_blocks(run_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    real_write = rows_mod.StepRows.write

    def slow_write(self: Any, w: Any, items: Any) -> None:
        release.wait(60)  # the writer is stuck until the loop has finished
        real_write(self, w, items)

    monkeypatch.setattr(rows_mod.StepRows, "write", slow_write)
    rec, model, opt = make(run_dir, queue_size=1)
    n = 20
    loop = threading.Thread(target=steps, args=(rec, model, opt, n), daemon=True)
    loop.start()
    loop.join(60)
    # The loop finished while the writer could not take a single item: submit never blocks.
    assert not loop.is_alive(), "training blocked on a full recorder queue"
    release.set()
    rec.close()
    got = steps_by_number(run_dir)
    meta = run_json(run_dir)
    dropped = meta["counters"]["dropped"].get("steps", 0)
    assert dropped >= n - 3 and len(got) + dropped == n
    ev = events(run_dir, "dropped_data")
    assert ev and ev[0]["severity"] == "warning"
    assert '"steps"' in ev[0]["details"]
