"""summary --watch and report --watch beside a training process that is still running:
the new findings are said while it trains, --fail-on stops at the first error (before the
training ends), and the live report is rewritten until the run ends."""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from rec_helpers import subprocess_env
from tracealyze.analyzer.cli import main
from tracealyze.analyzer.errors import RunDirError
from tracealyze.analyzer.report import watch

from tests.runfactory import make_run

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


# ---------------------------------------------------------------- every wait has a bound
# The run directory removed or replaced between two looks: the watch ends with one line
# (RunDirError) where it waited forever before. The looks are driven by a fake ``sleep`` that
# changes the folder: no real waiting.

class Looks:
    """A fake ``sleep``: ``changes[i]`` runs before the look after the i-th wait; past the
    last one it fails the test (a watch that would wait forever) instead of hanging."""

    def __init__(self, *changes) -> None:
        self.changes = list(changes)
        self.waits = 0

    def __call__(self, seconds: float) -> None:
        assert self.waits < len(self.changes), "the watch went on waiting"
        self.changes[self.waits]()
        self.waits += 1


def _watch(kind: str, run: Path, sleep, tmp_path: Path) -> None:
    if kind == "summary":
        watch.watch_summary(run, fail_on=None, interval_s=1.0, say=lambda s: None,
                            note=lambda s: None, sleep=sleep)
    else:
        watch.watch_report(run, tmp_path / "live.html", interval_s=1.0, note=lambda s: None,
                           sleep=sleep)


def _replace_with(how: str, run: Path) -> None:
    aside = run.with_name("aside")
    run.rename(aside)
    if how == "a symbolic link":
        run.symlink_to(aside, target_is_directory=True)  # (the same files, through a link)
    elif how == "another directory":
        shutil.copytree(aside, run)  # (a copy: the same content, another inode)
    elif how == "a file":
        run.write_text("not a run")


@pytest.mark.parametrize("kind", ["summary", "report"])
@pytest.mark.parametrize("how", ["removed", "a symbolic link", "another directory", "a file"])
def test_a_watch_ends_when_the_run_directory_goes_away(tmp_path: Path, kind: str,
                                                      how: str) -> None:

    run = make_run(tmp_path, steps=30, status="running")  # in progress: watched until ...
    change = (lambda: shutil.rmtree(run)) if how == "removed" else \
        (lambda: _replace_with(how, run))
    looks = Looks(lambda: None, change)  # ... the second wait changes it
    with pytest.raises(RunDirError) as e:
        _watch(kind, run, looks, tmp_path)
    want = f"the run directory {run} was " + (
        "removed while watching" if how == "removed" else f"replaced while watching (now {how})")
    assert str(e.value) == want and looks.waits == 2


def test_a_run_dir_given_through_a_link_that_is_re_pointed_ends_the_watch(
        tmp_path: Path) -> None:

    first = make_run(tmp_path, name="first", steps=30, status="running")
    second = make_run(tmp_path, name="second", steps=30, status="running")
    latest = tmp_path / "latest"
    latest.symlink_to(first, target_is_directory=True)  # followed: the usual "latest" link

    def re_point() -> None:
        latest.unlink()
        latest.symlink_to(second, target_is_directory=True)

    looks = Looks(lambda: None, re_point)
    with pytest.raises(RunDirError, match=r"replaced while watching \(now a link to another "
                                          r"directory\)"):
        _watch("summary", latest, looks, tmp_path)
    assert looks.waits == 2


@pytest.mark.parametrize("kind", ["summary", "report"])
def test_waiting_for_a_run_ends_when_the_folder_it_waits_in_goes_away(
        tmp_path: Path, kind: str) -> None:

    parent = tmp_path / "runs"
    parent.mkdir()
    run = parent / "run"  # not made yet: the watch waits for it in runs/ ...
    looks = Looks(lambda: None, lambda: shutil.rmtree(parent))  # ... which goes away
    with pytest.raises(RunDirError, match=f"the folder {parent}, where the run directory is "
                                          "to be made, was removed while waiting for the run"):
        _watch(kind, run, looks, tmp_path)
    # the run's own (empty) folder made, then removed before its run.json came
    parent.mkdir()
    looks = Looks(lambda: run.mkdir(), lambda: None, lambda: run.rmdir())
    with pytest.raises(RunDirError, match=f"the run directory {run} was removed while"):
        _watch(kind, run, looks, tmp_path)
    assert looks.waits == 3


def test_a_run_that_starts_in_the_folder_made_for_it_is_watched_to_its_end(
        tmp_path: Path) -> None:
    """The folder is known from its first appearance (not from the parent's identity), and
    the run's files arriving in it change nothing: the watch goes on to the run's end."""

    run = tmp_path / "run"

    def start() -> None:  # the recorder's files arrive in the folder already there
        made = make_run(tmp_path / "staging", steps=30, status="completed")
        for child in made.iterdir():
            child.rename(run / child.name)

    notes: list[str] = []
    looks = Looks(lambda: None, run.mkdir, lambda: None, start)
    summary, reached = watch.watch_summary(run, fail_on=None, interval_s=1.0,
                                           say=lambda s: None, note=notes.append, sleep=looks)
    assert summary["run"]["status"] == "completed" and not reached and looks.waits == 4
    assert "waiting for the run to start (no run.json yet)" in notes


def test_the_cli_says_a_removed_run_directory_in_one_line_and_exits_2(
        tmp_path: Path, monkeypatch) -> None:

    run = make_run(tmp_path, steps=30, status="running")
    looks = Looks(lambda: shutil.rmtree(run))
    monkeypatch.setattr(watch, "watch_summary", functools.partial(watch.watch_summary,
                                                                  sleep=looks))
    res = CliRunner().invoke(main, ["summary", str(run), "--watch"])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip().splitlines()[-1] == \
        f"Error: the run directory {run} was removed while watching"
    assert "Traceback" not in res.output and looks.waits == 1
