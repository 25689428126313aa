"""A Ctrl-C while the run is being saved (issue N2): ``close()`` holds it, finishes its drain,
marks the run, and only then hands the interrupt on; a writer that does not finish within the
grace period after a second interrupt is given up with a clear line, the run still marked."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from rec_helpers import batches, run_json, steps_by_number, tiny_model, train
from tracealyze.recorder import Recorder
from tracealyze.recorder.live import interrupts
from tracealyze.recorder.write.writer import Writer


def _slow_flush(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    real = Writer.flush

    def flush(self: Writer) -> None:
        time.sleep(seconds)
        real(self)

    monkeypatch.setattr(Writer, "flush", flush)


def _interrupt_after(seconds: float, times: int = 1) -> threading.Thread:
    def go() -> None:
        for _ in range(times):
            time.sleep(seconds)
            os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_ctrl_c_during_close_is_held_until_the_run_is_saved(tmp_path: Path, monkeypatch) -> None:
    _slow_flush(monkeypatch, 0.6)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder(tmp_path / "run", model=model, optimizer=opt, flush_interval_s=60)
    train(rec, model, opt, batches(40))
    before = signal.getsignal(signal.SIGINT)
    t = _interrupt_after(0.1, times=2)  # two presses, 100 ms apart, during the save
    with pytest.raises(KeyboardInterrupt):
        rec.close()  # not raised inside the drain: afterwards, once
    t.join()
    meta = run_json(tmp_path / "run")
    assert meta["status"] == "completed"
    assert sorted(steps_by_number(tmp_path / "run")) == list(range(40))
    assert signal.getsignal(signal.SIGINT) is before  # put back as it was


def test_ctrl_c_during_close_inside_an_exception_is_not_raised_again(tmp_path: Path,
                                                                      monkeypatch) -> None:
    """The first Ctrl-C's KeyboardInterrupt is on its way out: the held second one is not
    raised on top of it."""
    _slow_flush(monkeypatch, 0.6)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with (pytest.raises(KeyboardInterrupt, match="first"),
          Recorder(tmp_path / "run", model=model, optimizer=opt, flush_interval_s=60) as rec):
        train(rec, model, opt, batches(25))
        _interrupt_after(0.1)
        raise KeyboardInterrupt("first")
    assert run_json(tmp_path / "run")["status"] == "crashed"
    assert sorted(steps_by_number(tmp_path / "run")) == list(range(25))


def test_a_hung_writer_is_given_up_after_the_grace_period(tmp_path: Path, monkeypatch,
                                                          capfd) -> None:
    monkeypatch.setattr(interrupts, "GRACE_S", 0.5)
    monkeypatch.setattr(interrupts.HeldInterrupts.__init__, "__defaults__", (0.5,))
    _slow_flush(monkeypatch, 30)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder(tmp_path / "run", model=model, optimizer=opt, flush_interval_s=60)
    train(rec, model, opt, batches(5))
    _interrupt_after(0.2)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        rec.close()
    assert time.monotonic() - started < 10
    err = capfd.readouterr().err
    assert "interrupted while saving the run" in err and "steps not yet written are lost" in err
    assert run_json(tmp_path / "run")["status"] == "completed"
