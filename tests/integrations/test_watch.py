"""summary --watch and report --watch beside a training process that is still running:
the new findings are said while it trains, --fail-on stops at the first error (before the
training ends), and the live report is rewritten until the run ends."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from rec_helpers import subprocess_env

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-c", "from tracealyze.analyzer.cli import main; main()"]
TRAIN = """
import sys, time, torch
from torch import nn
from tracealyze.recorder import Recorder
run, steps, nan_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
with Recorder(run, model=model, optimizer=opt, flush_interval_s=0.3, system_interval_s=0,
              profile_start=0) as rec:
    for step in range(steps):
        x = torch.randn(16, 8)
        if step >= nan_at:
            x[0, 0] = float("nan")   # a bad batch from here on
        loss = model(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        rec.step(loss=loss)
        time.sleep(0.03)
"""


def _train(run: Path, steps: int, nan_at: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", TRAIN, str(run), str(steps), str(nan_at)],
                            env=subprocess_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def test_summary_watch_fails_at_the_first_error_while_training_goes_on(tmp_path: Path) -> None:
    run = tmp_path / "run"
    trainer = _train(run, steps=600, nan_at=60)  # ~20 s of training, NaN from ~2 s
    try:
        t0 = time.monotonic()
        out = subprocess.run([*CLI, "summary", str(run), "--watch", "--interval", "0.5",
                              "--fail-on", "error"], capture_output=True, text=True,
                             timeout=240)
        took = time.monotonic() - t0
        assert out.returncode == 1, out.stderr[-2000:]
        assert trainer.poll() is None, "the watch should stop before the training ends"
        assert "nonfinite" in out.stdout and took < 60
        assert "watching" in out.stderr
    finally:
        trainer.kill()
        trainer.wait()


def test_summary_watch_ends_with_the_run_and_waits_for_it_to_start(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()  # the folder exists, the run has not started yet
    watcher = subprocess.Popen([*CLI, "summary", str(run), "--watch", "--interval", "0.5"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)
    trainer = _train(run, steps=80, nan_at=10**9)  # healthy, ~3 s
    assert trainer.wait(timeout=120) == 0, trainer.stderr.read()
    out, err = watcher.communicate(timeout=120)
    assert watcher.returncode == 0, err
    assert "waiting for the run to start" in err and "no longer in progress (completed)" in err
    assert "status=completed" in out  # the final summary


def test_report_watch_rewrites_a_live_page_until_the_run_ends(tmp_path: Path) -> None:
    run = tmp_path / "run"
    page = tmp_path / "live.html"
    trainer = _train(run, steps=200, nan_at=10**9)  # ~8 s
    try:
        watcher = subprocess.Popen([*CLI, "report", str(run), "-o", str(page), "--watch", "1"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen_live = False
        deadline = time.monotonic() + 120
        while trainer.poll() is None and time.monotonic() < deadline:
            if page.exists() and 'id="live"' in page.read_text():
                seen_live = True
                assert 'http-equiv="refresh" content="1"' in page.read_text()
            time.sleep(0.3)
        out, err = watcher.communicate(timeout=120)
    finally:
        trainer.kill()
        trainer.wait()
    assert watcher.returncode == 0, err
    assert seen_live, err
    final = page.read_text()
    assert 'id="live"' not in final and 'http-equiv="refresh"' not in final
    assert "final report" in err and out.strip() == str(page)


def test_watching_a_folder_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    # (the run's own folder may be made later; a parent that is not there is a typo)
    out = subprocess.run([*CLI, "summary", str(tmp_path / "nope" / "run"), "--watch"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no such directory" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_watch_reads_again_when_the_ranks_ended_before_run_json_says_so(
        tmp_path: Path, monkeypatch) -> None:
    """The summary and the liveness were two reads: a rank could finish between them, so the
    last snapshot said "running" while the run was no longer in progress, and the watch
    ended on it (1 time in 3). In progress now comes from the summary's own reading: a
    summary made while the run still ran keeps the watch going, and it ends on the next."""
    import shutil

    from tracealyze.analyzer.report import watch

    run = tmp_path / "run"  # a completed run ...
    shutil.copytree(Path(__file__).parents[2] / "sample_traces" / "exploding_gradients", run)
    real = watch.summary_of
    calls = iter([True, True, False])

    def summary_made_while_running(analysis):  # ... whose first summaries predate its end
        out = real(analysis)
        if next(calls):
            out["run"]["status"] = "running"
        return out

    monkeypatch.setattr(watch, "summary_of", summary_made_while_running)
    notes: list[str] = []
    summary, reached = watch.watch_summary(run, fail_on=None, interval_s=0.5, say=lambda s: None,
                                           note=notes.append, sleep=lambda s: None)
    assert summary["run"]["status"] == "completed" and not reached
    assert notes[-1] == "the run is no longer in progress (completed)"
