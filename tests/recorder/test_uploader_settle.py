"""The uploader says how long a store outage held the uploads up (``storage_delayed``) even
when the store comes back only as the run closes: its last attempt is made before the
writer's last flush (``settle``), so the event reaches the run's events table. Before, the
thread's backoff (2, 4, 8, 16 s) could leave no attempt between the store's return and the
close, and an event raised after the writer's last flush was lost (a test of a 20 s outage
failed that way under load)."""

from __future__ import annotations

import time
from pathlib import Path

from tracealyze.format.spool import Uploader
from tracealyze.format.storage import locate


def test_settle_reports_the_outage_before_the_last_flush(tmp_path: Path) -> None:
    spool, store = tmp_path / "spool", tmp_path / "store"
    spool.mkdir()
    store.mkdir()
    (spool / "run.json").write_text("{}")
    events: list[tuple[str, dict]] = []
    up = Uploader(spool, locate(store.as_uri()), interval_s=0.5,
                  on_event=lambda kind, msg, sev, details: events.append((kind, details)))
    real = up.sync
    down = {"now": True}

    def flaky() -> None:
        if down["now"]:
            raise OSError("connection refused")
        real()

    up.sync = flaky  # type: ignore[method-assign]
    up.wake()
    deadline = time.monotonic() + 10
    while up.failures == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [k for k, _ in events] == ["storage_unavailable"]
    time.sleep(2.3)  # held up past the 2 s an ordinary upload may take
    down["now"] = False  # the store is back, and the run closes at once
    up.settle(5.0)
    assert [k for k, _ in events] == ["storage_unavailable", "storage_delayed"]
    assert events[-1][1]["delay_s"] >= 2.0
    assert up.close(5.0) and (store / "run.json").exists()


def test_what_the_store_holds_is_known_before_the_first_sync(tmp_path: Path) -> None:
    """``import-trace`` into a URL tells the uploader what the store already holds; its
    thread syncs as soon as it starts, so that must be known at construction (set after it,
    a busy machine's first sync re-sent every part of the run: a flaky test showed it)."""
    from tracealyze.format.storage import local_files

    spool, store = tmp_path / "spool", tmp_path / "store"
    (spool / "steps" / "rank=0").mkdir(parents=True)
    (store / "steps" / "rank=0").mkdir(parents=True)  # (a local "store" has folders)
    (spool / "run.json").write_text("{}")
    (spool / "steps" / "rank=0" / "part-000000.parquet").write_bytes(b"x" * 100)
    held = local_files(spool)
    (spool / "steps" / "rank=0" / "part-000001.parquet").write_bytes(b"y" * 50)
    up = Uploader(spool, locate(store.as_uri()), interval_s=3600.0, uploaded=held)
    assert up.close(5.0)
    sent = sorted(p.relative_to(store).as_posix() for p in store.rglob("*") if p.is_file())
    assert sent == ["steps/rank=0/part-000001.parquet"]
    assert up.bytes_uploaded == 50
