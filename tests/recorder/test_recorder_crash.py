"""Crash safety and resume, with real processes: SIGKILL mid-run, SIGTERM, exceptions
inside and outside the ``with`` block, and ``resume=True`` after a kill."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from rec_helpers import (
    FAST,
    HERE,
    PART_RE,
    TABLE_NAMES,
    batches,
    events,
    loss_fn,
    run_json,
    run_script,
    steps_by_number,
    subprocess_env,
    tiny_model,
    write_script,
)
from tracealyze.analyzer.run.catalog import open_run
from tracealyze.recorder import Recorder
from tracealyze.recorder.write.writer import merge_parts

pytestmark = pytest.mark.slow
CHILD = str(HERE / "rec_child.py")
FLUSH_S = 0.2


class Child:
    """A rec_child.py process whose ``STEP`` lines are collected with their arrival."""

    def __init__(self, run_dir: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, CHILD, str(run_dir), *args], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=subprocess_env())
        self.steps: list[tuple[int, float]] = []  # (step, time the child reported it)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())
            parts = line.split()
            if parts and parts[0] == "STEP":
                self.steps.append((int(parts[1]), float(parts[2])))

    def wait_for(self, cond, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if self.proc.poll() is not None:
                raise AssertionError(f"child exited early ({self.proc.returncode}): "
                                     f"{self.stderr()}")
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"timed out; last lines {self.lines[-3:]}")
            time.sleep(0.02)

    def finish(self, timeout: float = 60) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self._reader.join(5)
        return rc

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read() if self.proc.poll() is not None else ""


def n_step_parts(run_dir: Path) -> int:
    d = run_dir / "steps" / "rank=0"
    return sum(1 for p in d.iterdir() if PART_RE.match(p.name)) if d.is_dir() else 0


def all_parts(run_dir: Path) -> list[Path]:
    return [p for t in TABLE_NAMES for p in (run_dir / t).rglob("*")
            if p.is_file() and PART_RE.match(p.name)]


def kill_mid_run(run_dir: Path, *extra: str) -> tuple[Child, float]:
    child = Child(run_dir, "--steps", "100000", "--sleep", "0.01", "--flush", str(FLUSH_S),
                  *extra)
    # A few flushes written, and long enough that the loss bound below is meaningful.
    child.wait_for(lambda: n_step_parts(run_dir) >= 3 and len(child.steps) >= 30
                   and time.time() - child.steps[0][1] > FLUSH_S + 2.0)
    killed_at = time.time()
    child.proc.send_signal(signal.SIGKILL)
    assert child.finish() == -signal.SIGKILL
    return child, killed_at


def test_sigkill_leaves_readable_parts_and_loses_at_most_one_interval(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    child, killed_at = kill_mid_run(run_dir)
    parts = all_parts(run_dir)
    assert parts
    for p in parts:
        pq.read_table(p)  # every data file is complete
    steps = steps_by_number(run_dir)  # also: no duplicate step rows
    last = max(steps)
    assert sorted(steps) == list(range(last + 1)), "steps are not contiguous from 0"
    reported = dict(child.steps)
    assert last <= max(reported)
    # Everything handed to the recorder more than one flush interval before the kill is on
    # disk. (1 s of slack for thread scheduling on a loaded 2-core machine.)
    old = [s for s, t in child.steps if t < killed_at - FLUSH_S - 1.0]
    assert old, child.steps[:3]
    assert last >= max(old), (last, max(old))
    for s in steps.values():
        assert s["loss"] is not None and s["grad_norm"] is not None
    meta = run_json(run_dir)
    assert meta["status"] == "running"  # killed without a chance to say so...
    assert meta["heartbeat"] > meta["started"]  # ...but the heartbeat shows when it stopped


def test_sigterm_closes_run_as_crashed_with_data_flushed(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    child = Child(run_dir, "--steps", "100000", "--sleep", "0.01", "--flush", "30")
    child.wait_for(lambda: len(child.steps) >= 5)
    child.proc.send_signal(signal.SIGTERM)
    rc = child.finish()
    assert rc == -signal.SIGTERM  # the default action still ends the process
    meta = run_json(run_dir)
    assert meta["status"] == "crashed" and meta["ended"] is not None
    steps = steps_by_number(run_dir)
    # flush_interval 30 s: these rows can only be there because SIGTERM flushed them.
    assert max(steps) >= max(s for s, _ in child.steps)
    assert sorted(steps) == list(range(max(steps) + 1))
    sig = events(run_dir, "signal")
    assert len(sig) == 1 and sig[0]["subject"] == "SIGTERM"


@pytest.mark.parametrize("mode", ["raise_in_with", "raise_outside"])
def test_exception_recorded_and_reraised(tmp_path: Path, mode: str) -> None:
    run_dir = tmp_path / "run"
    child = Child(run_dir, "--steps", "10", "--flush", "30", "--mode", mode)
    rc = child.finish()
    err = child.stderr()
    assert rc == 1 and "boom from the training loop" in err  # re-raised, not swallowed
    assert "DONE" not in child.lines
    meta = run_json(run_dir)
    assert meta["status"] == "crashed" and meta["ended"] is not None
    exc = events(run_dir, "exception")
    assert len(exc) == 1
    e = exc[0]
    assert e["severity"] == "critical" and "RuntimeError: boom" in e["message"]
    assert "Traceback" in e["stack"] and "rec_child.py" in e["stack"]
    assert json.loads(e["details"])["type"] == "RuntimeError"
    assert sorted(steps_by_number(run_dir)) == [0, 1, 2]


def test_resume_after_sigkill_continues_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    kill_mid_run(run_dir)
    before = steps_by_number(run_dir)
    last = max(before)
    run_id = run_json(run_dir)["run_id"]
    old_parts = {p: p.read_bytes() for p in all_parts(run_dir)}
    old_max_seq = max(int(PART_RE.match(p.name).group(2) or PART_RE.match(p.name).group(1))
                      for p in old_parts)
    # A stale temporary file of the killed writer must not confuse the resumed one.
    (run_dir / "steps" / "rank=0" / ".part-999999.parquet.1.tmp").write_bytes(b"junk")

    child = Child(run_dir, "--steps", "5", "--resume", "--no-merge", "--flush", "0.05")
    assert child.finish() == 0, child.stderr()
    assert child.lines[0] == f"READY {last + 1}"
    for p, data in old_parts.items():
        assert p.read_bytes() == data, f"{p} was overwritten"
    new_parts = set(all_parts(run_dir)) - set(old_parts)
    assert new_parts and all(int(PART_RE.match(p.name).group(1)) > old_max_seq
                             for p in new_parts)
    assert not list(run_dir.rglob(".part-999999*"))

    # A third process resumes again and merges at close: still no duplicate rows.
    child = Child(run_dir, "--steps", "3", "--resume", "--flush", "0.05")
    assert child.finish() == 0, child.stderr()
    steps = steps_by_number(run_dir)  # asserts no duplicates
    assert sorted(steps) == list(range(last + 1 + 5 + 3))
    for s, row in before.items():
        assert steps[s]["loss"] == row["loss"]
    meta = run_json(run_dir)
    assert meta["run_id"] == run_id and meta["status"] == "completed"
    assert [r["from_step"] for r in meta["resumes"]] == [last + 1, last + 6]
    resumed = events(run_dir, "resumed")
    assert sorted(e["step"] for e in resumed) == [last + 1, last + 6]
    for table in ("steps", "tensor_stats"):
        files = [p.name for p in (run_dir / table / "rank=0").iterdir()]
        assert all(PART_RE.match(f) for f in files), files


def test_resume_after_kill_between_merge_and_deletes(tmp_path: Path) -> None:
    """A kill between the merge's rename and its deletes leaves part-a-b AND part-a..b.
    A resumed run must not merge those leftovers again (two merged files holding the same
    rows would duplicate them for every correct reader)."""
    import shutil


    run_dir = tmp_path / "run"
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def session(n: int, **kw: object) -> None:
        with Recorder(run_dir, model=model, optimizer=opt, flush_rows=1,
                      **{**FAST, **kw}) as rec:
            for x, y in batches(n):
                loss = loss_fn(model, x, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                rec.step(loss=loss)
                time.sleep(0.12)  # past the flush interval: one part per step

    session(3, merge_on_close=False)
    backup = tmp_path / "singles"
    shutil.copytree(run_dir / "steps", backup)
    merge_parts(run_dir, 0)
    shutil.copytree(backup, run_dir / "steps", dirs_exist_ok=True)  # the deletes never ran
    files = sorted(p.name for p in (run_dir / "steps" / "rank=0").iterdir())
    assert any("-" in f[5:] for f in files) and len(files) > 2, files

    session(2, resume=True)
    assert sorted(steps_by_number(run_dir)) == [0, 1, 2, 3, 4]  # asserts no duplicates too
    with open_run(run_dir) as run:
        _, n = run.query("SELECT count(*), count(DISTINCT step) FROM steps")
        assert n == [(5, 5)]


FORK_SCRIPT = """
import multiprocessing as mp, os, signal, sys, time, json
import torch
from tracealyze.recorder import Recorder

def idle():
    time.sleep(30)

if __name__ == "__main__":
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    rec = Recorder(sys.argv[1], model=m, optimizer=opt, system_interval_s=0,
                   flush_interval_s=0.05, profile_start=0)
    m(torch.ones(1, 2)).sum().backward(); opt.step(); rec.step(loss=1.0)
    # A forked helper (a DataLoader worker, say) inherits the recorder's signal handler.
    p = mp.get_context("fork").Process(target=idle)
    p.start()
    time.sleep(0.5)
    os.kill(p.pid, signal.SIGTERM)  # e.g. the job scheduler signals every process
    p.join(20)
    status = json.load(open(os.path.join(sys.argv[1], "run.json")))["status"]
    print("CHILD", p.exitcode, "STATUS", status, flush=True)
    m(torch.ones(1, 2)).sum().backward(); opt.step(); rec.step(loss=2.0)
    rec.close()
"""


def test_forked_child_does_not_close_the_parents_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_script(write_script(tmp_path, "fork.py", FORK_SCRIPT), str(run_dir),
                      timeout=90)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("CHILD"))
    # The child still dies of SIGTERM, and the parent's run is untouched by it.
    assert line == f"CHILD {-signal.SIGTERM} STATUS running", line
    assert events(run_dir, "signal") == []
    assert sorted(steps_by_number(run_dir)) == [0, 1]
    assert run_json(run_dir)["status"] == "completed"
