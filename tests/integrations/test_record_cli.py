"""``tracealyze record -- COMMAND``: unmodified scripts (a plain loop, a transformers
Trainer, a Lightning Trainer, torchrun DDP) are recorded end to end, with the values their
own training step computed; exit codes and signals pass through; bad input is one line."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import scripts
from rec_helpers import events, run_json, steps_by_number
from reference import assert_close, grad_norms

ROOT = str(Path(__file__).resolve().parents[2])
CLI = [sys.executable, "-c", "from tracealyze.analyzer.cli import main; main()"]


def _record(tmp_path: Path, code: str, *args: str, run: str = "run",
            extra: tuple[str, ...] = (), timeout: int = 240) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(code.format(root=ROOT))
    return subprocess.run([*CLI, "record", "--run-dir", str(tmp_path / run), *extra, "--",
                           sys.executable, str(script), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


# (transformers' own GPT-2 goes through record in the Trainer script below; all four matrix
# models go through Lightning in test_lightning.py — kept to two here for CI time)
@pytest.mark.parametrize("spec,model_class", [("nanogpt", "NanoGPT"), ("resnet", "ResNet")])
def test_plain_loop_is_recorded_with_its_own_values(tmp_path: Path, spec: str,
                                                    model_class: str) -> None:
    out = _record(tmp_path, scripts.PLAIN, str(tmp_path / "ref.json"), "0", spec,
                  "--lr", "3e-4", "--hf-token=hunter2-tok", "--fp16",  # (ignored by the script)
                  extra=("--set", "system_interval_s=0", "--set", "grad_norm_budget=0"))
    assert out.returncode == 0, out.stderr
    ref = json.loads((tmp_path / "ref.json").read_text())
    run = tmp_path / "run"
    steps = steps_by_number(run)
    assert sorted(steps) == list(range(len(ref)))  # evaluation passes are not steps
    per_param = grad_norms(run)
    for i, r in enumerate(ref):
        assert_close(steps[i]["loss"], r["loss"], 1e-6, f"loss {i}")
        assert_close(steps[i]["lr"], r["lr"], 1e-9, f"lr {i}")
        assert_close(steps[i]["grad_norm"], math.sqrt(sum(v * v for v in r["norms"].values())),
                     1e-4, f"grad_norm {i}")
        for name, v in r["norms"].items():
            assert_close(per_param[i][name], v, 1e-4, f"{name} at {i}")
        assert steps[i]["data_wait_s"] is not None
    meta = run_json(run)
    assert meta["status"] == "completed" and meta["exit_code"] == 0
    assert meta["model"]["class"] == model_class
    assert f"recorded {run}" in out.stderr
    # the command line as the run's hyperparameters, a secret's value left out
    hp = meta["hparams"]
    assert hp["command"].endswith(f"{spec} --lr 3e-4 '--hf-token=<redacted>' --fp16")
    assert (hp["cli.lr"], hp["cli.fp16"], hp["cli.hf_token"]) == (3e-4, True, "<redacted>")
    # (a value no run id or hash can hold by chance: "abc" is hex, and once was in one)
    assert "hunter2-tok" not in (run / "run.json").read_text()


def test_exit_code_passes_through_and_marks_the_run_crashed(tmp_path: Path) -> None:
    out = _record(tmp_path, scripts.PLAIN, str(tmp_path / "ref.json"), "3")
    assert out.returncode == 3
    meta = run_json(tmp_path / "run")
    assert meta["status"] == "crashed" and meta["exit_code"] == 3


def test_hf_trainer_script_is_recorded_through_the_callback(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out = _record(tmp_path, scripts.HF, str(tmp_path / "ref.json"), str(tmp_path / "out"))
    assert out.returncode == 0, out.stderr[-2000:]
    logs = json.loads((tmp_path / "ref.json").read_text())
    steps = steps_by_number(tmp_path / "run")
    assert sorted(steps) == list(range(6))
    for log in logs:
        s = steps[log["step"] - 1]
        assert_close(s["loss"], log["loss"], 1e-5, "loss")
        assert_close(s["grad_norm"], log["grad_norm"], 1e-5, "grad_norm")  # before clipping
    assert run_json(tmp_path / "run")["status"] == "completed"


def test_lightning_script_is_recorded_through_the_callback(tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch")
    out = _record(tmp_path, scripts.LIGHTNING, str(tmp_path / "ref.json"), str(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    ref = json.loads((tmp_path / "ref.json").read_text())
    steps = steps_by_number(tmp_path / "run")
    assert sorted(steps) == list(range(6))
    for i, loss in enumerate(ref):
        assert_close(steps[i]["loss"], loss, 1e-6, f"loss {i}")
        assert steps[i]["grad_norm"] > 0


@pytest.mark.slow
def test_torchrun_ranks_share_one_run_dir(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun not on PATH")
    script = tmp_path / "ddp.py"
    script.write_text(scripts.DDP)
    out = subprocess.run(
        [*CLI, "record", "--run-dir", str(tmp_path / "run"), "--set", "system_interval_s=0",
         "--", torchrun, "--standalone", "--nproc-per-node", "2", str(script)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    for rank in (0, 1):
        steps = steps_by_number(tmp_path / "run", rank)
        assert sorted(steps) == list(range(5)), rank
    assert run_json(tmp_path / "run")["world_size"] == 2


def test_sigterm_is_passed_on_and_the_run_closed(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(scripts.SLEEPER)
    proc = subprocess.Popen([*CLI, "record", "--run-dir", str(tmp_path / "run"), "--",
                             sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    assert proc.stdout is not None
    deadline = time.time() + 120
    while "READY" not in proc.stdout.readline():
        assert time.time() < deadline and proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    run = tmp_path / "run"
    assert run_json(run)["status"] == "crashed"
    assert sorted(steps_by_number(run)) == [0, 1, 2]
    assert events(run, "signal")


@pytest.mark.parametrize("argv,message", [
    (["--", sys.executable, "missing.py"], "script not found: missing.py"),
    (["--", "no-such-program-xyz"], "command not found: no-such-program-xyz"),
    (["--set", "grad_norm_every=-1", "--", sys.executable, "-c", "pass"], "grad_norm_every"),
    (["--set", "bogus", "--", sys.executable, "-c", "pass"], "knob=value"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, argv: list[str], message: str
                                          ) -> None:
    out = subprocess.run([*CLI, "record", "--run-dir", str(tmp_path / "run"), *argv],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env={**os.environ})
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()


def test_the_record_command_itself_never_imports_torch() -> None:
    code = ("import sys\nfrom tracealyze.analyzer import record as r\n"
            "r.check_knobs('debug', {'grad_norm_every': 2}); r.boot_dir()\n"
            "r.check_command([sys.executable, '-c', 'pass'])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
