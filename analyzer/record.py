"""``tracealyze record``: run an unmodified training command under the recorder.

This process never imports torch. It starts the command with the folder of
``tracealyze/recorder/integrations/_boot`` first on ``PYTHONPATH``: its ``sitecustomize``
attaches the recorder inside every Python process of the command (each ``torchrun`` rank),
configured by the ``TRACEALYZE_RECORD`` environment variable. SIGINT and SIGTERM are passed
on to the command, and its exit code is returned.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import TracealyzeError


def boot_dir() -> Path:
    """The folder holding the recorder's ``sitecustomize.py`` (found without importing the
    recorder, which would import torch)."""
    spec = importlib.util.find_spec("tracealyze.recorder")
    if spec is None or not spec.submodule_search_locations:
        raise TracealyzeError("tracealyze.recorder is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "integrations" / "_boot"


def check_command(command: Sequence[str]) -> None:
    """One clear error for a command that cannot start: nothing to run, a program that is
    not there, or (``python SCRIPT``) a script that is not there."""
    if not command:
        raise TracealyzeError("no command to record: tracealyze record -- python train.py ARGS")
    prog = command[0]
    if shutil.which(prog) is None and not Path(prog).is_file():
        raise TracealyzeError(f"command not found: {prog}")
    name = Path(prog).name
    if name.startswith("python") or name in ("torchrun",):
        script = next((a for a in command[1:] if not a.startswith("-")), None)
        if script is not None and script.endswith(".py") and not Path(script).is_file():
            raise TracealyzeError(f"script not found: {script}")


def default_run_dir(command: Sequence[str]) -> Path:
    script = next((a for a in command[1:] if a.endswith(".py")), command[0])
    return Path("runs") / f"{Path(script).stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_run_dir(run_dir: Path) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise TracealyzeError(f"run_dir {str(run_dir)!r} exists and is not a directory")
    if (run_dir / "run.json").exists():
        raise TracealyzeError(f"run_dir {str(run_dir)!r} already holds a run; choose another "
                              "--run-dir")


def record(command: Sequence[str], *, run_dir: Path, preset: str = "standard",
           knobs: dict[str, Any] | None = None) -> int:
    """Run ``command`` recorded into ``run_dir``; returns its exit code (128 + N when a
    signal N ended it, as a shell reports it)."""
    check_command(command)
    check_run_dir(run_dir)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(boot_dir()), *filter(None, [env.get("PYTHONPATH")])])
    env["TRACEALYZE_RECORD"] = json.dumps(
        {"run_dir": str(run_dir.resolve()), "preset": preset, "knobs": knobs or {}})
    child = subprocess.Popen(list(command), env=env)

    def forward(signum: int, _frame: Any) -> None:
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = child.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    code = 128 - code if code < 0 else code
    mark_exit(run_dir, code)
    return code


def mark_exit(run_dir: Path, code: int) -> None:
    """The command's exit code in run.json; a run whose command failed is not completed
    (``sys.exit(3)`` closes it normally inside the script)."""
    from tracealyze.format.parts import write_json_atomic
    from tracealyze.format.runmeta import read_json

    path = run_dir / "run.json"
    meta = read_json(path) if path.exists() else None
    if meta is None:
        return
    meta["exit_code"] = code
    if code != 0 and meta.get("status") in ("completed", "running"):
        meta["status"] = "crashed"
    write_json_atomic(path, meta)


def check_knobs(preset: str, knobs: dict[str, Any]) -> None:
    """The recorder's own validation of ``preset`` and ``--set`` knobs, here, before the
    command starts: its config module is plain Python (loaded by path: importing the
    recorder package would import torch)."""
    import sys

    path = boot_dir().parent.parent / "config.py"
    spec = importlib.util.spec_from_file_location("_tracealyze_recorder_config", path)
    if spec is None or spec.loader is None:
        raise TracealyzeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses looks its module up)
    try:
        spec.loader.exec_module(module)
        module.RecorderConfig.from_preset(preset, **knobs)
    except ValueError as exc:
        raise TracealyzeError(str(exc)) from exc
    finally:
        sys.modules.pop(spec.name, None)


def parse_set(items: Sequence[str]) -> dict[str, Any]:
    """``--set knob=value``: the value as JSON (numbers, true/false, null), else a string."""
    knobs: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise TracealyzeError(f"--set takes knob=value, got {item!r}")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        knobs[name.strip()] = value
    return knobs
