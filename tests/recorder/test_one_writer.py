"""A rank folder has one writer (issue N5): a second recorder on a rank that a live process is
writing is refused with a ValueError naming that process, across processes, in one process,
and across hosts (the heartbeat); a killed writer's rank is taken over by resume."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from rec_helpers import run_json, steps_by_number, tiny_model
from tracealyze.recorder import Recorder

ROOT = str(Path(__file__).resolve().parents[2])

WRITER = '''
import sys, time, torch
sys.path.insert(0, {root!r})
from tracealyze.recorder import Recorder
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
rec = Recorder({run!r}, model=model, optimizer=opt, flush_interval_s=0.2)
for step in range(100000):
    loss = model(torch.randn(3, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step(); rec.step(loss=loss)
    if step == 20:
        print("READY", flush=True)
    time.sleep(0.01)
'''


def _start_writer(run: Path) -> subprocess.Popen:
    script = run.parent / "writer.py"
    script.write_text(WRITER.format(root=ROOT, run=str(run)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert "READY" in proc.stdout.readline(), proc.stderr.read() if proc.stderr else ""
    return proc


def _recorder(run: Path, **kw) -> Recorder:
    model = tiny_model()
    return Recorder(run, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                    **kw)


def test_resume_while_the_first_writer_lives_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = _start_writer(run)
    try:
        with pytest.raises(ValueError) as e:
            _recorder(run, resume=True)
        msg = str(e.value)
        assert f"pid {proc.pid}" in msg and socket.gethostname() in msg, msg
        assert proc.poll() is None  # the first writer goes on
        time.sleep(0.5)
        meta = run_json(run)
        assert meta["resumes"] == [] and meta["status"] == "running"
    finally:
        proc.kill()
        proc.wait()
    steps = steps_by_number(run)  # no duplicate or vanished step rows
    assert sorted(steps) == list(range(len(steps)))


def test_a_killed_writers_rank_is_taken_over_by_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = _start_writer(run)
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = max(steps_by_number(run))
    rec = _recorder(run, resume=True)
    assert rec.current_step == before + 1
    rec.close()
    assert run_json(run)["resumes"][0]["from_step"] == before + 1


def test_two_recorders_in_one_process_on_one_rank(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = _recorder(run)
    try:
        with pytest.raises(ValueError, match=f"pid {os.getpid()}"):
            _recorder(run, resume=True)
    finally:
        first.close()
    second = _recorder(run, resume=True)  # after close, the rank is free
    second.close()
    assert len(run_json(run)["resumes"]) == 1


def _foreign_rank_file(run: Path, heartbeat: float) -> Path:
    f = run / "ranks" / "rank=0.json"
    meta = json.loads(f.read_text())
    meta.update(status="running", host="another-host", pid=1, heartbeat=heartbeat)
    f.write_text(json.dumps(meta))
    return f


def test_a_live_writer_on_another_host_is_seen_by_its_heartbeat(tmp_path: Path) -> None:
    """A shared file system may not share locks between hosts: a heartbeat that moves is a
    live writer."""
    run = tmp_path / "run"
    _recorder(run).close()
    f = _foreign_rank_file(run, time.time())
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.3):
            meta = json.loads(f.read_text())
            meta["heartbeat"] = time.time()
            f.write_text(json.dumps(meta))

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        with pytest.raises(ValueError, match="another-host"):
            _recorder(run, resume=True)
    finally:
        stop.set()
        t.join()


def test_a_stale_heartbeat_on_another_host_is_a_killed_writer(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _recorder(run).close()
    _foreign_rank_file(run, time.time() - 3600)
    _recorder(run, resume=True).close()
    assert run_json(run)["status"] == "completed"
