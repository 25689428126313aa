"""``tracealyze record``: run an unmodified training command under the recorder.

This process never imports torch. It starts the command with the folder of
``tracealyze/recorder/integrations/_boot`` first on ``PYTHONPATH``: its ``sitecustomize``
attaches the recorder inside every Python process of the command (each ``torchrun`` rank),
configured by the ``TRACEALYZE_RECORD`` environment variable. SIGINT, SIGTERM, SIGHUP and
SIGQUIT are passed on to the command (once: see :func:`_wait`), and its exit code is returned.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
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
    """One clear error, before the command starts, for a run_dir that cannot take the run."""
    if run_dir.exists() and not run_dir.is_dir():
        raise TracealyzeError(f"run_dir {str(run_dir)!r} exists and is not a directory")
    if (run_dir / "run.json").exists():
        raise TracealyzeError(f"run_dir {str(run_dir)!r} already holds a run; choose another "
                              "--run-dir")


def prepare_run_dir(run_dir: Path) -> list[Path]:
    """check_run_dir, then create ``run_dir`` and write a probe file in it, so that an
    unwritable one is one clear line before the command starts; returns the folders it
    created (taken back by :func:`take_back` if nothing gets recorded)."""
    check_run_dir(run_dir)
    created = [p for p in (run_dir, *run_dir.parents) if not p.exists()]
    from tracealyze.format.parts import make_writable_dir

    try:
        make_writable_dir(run_dir)
    except OSError as e:
        take_back(created)
        raise TracealyzeError(f"cannot write to run_dir {str(run_dir)!r}: "
                              f"{e.strerror or e}") from None
    return created


def take_back(created: list[Path]) -> None:
    """Remove the folders :func:`prepare_run_dir` created, innermost first, if empty."""
    for d in created:
        try:
            d.rmdir()
        except OSError:
            return


FORWARDED = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
                  if hasattr(signal, n))
"""Signals passed on to the command: Ctrl-C, a scheduler's stop, a closed terminal, Ctrl-\\."""

SI_KERNEL = 0x80
"""``si_code`` of a signal the kernel sent: a terminal's Ctrl-C, Ctrl-\\ or hang-up, which
goes to the whole foreground process group."""


def record(command: Sequence[str], *, run_dir: Path | str, preset: str = "standard",
           knobs: dict[str, Any] | None = None) -> int:
    """Run ``command`` recorded into ``run_dir`` (a local directory, or a URL: the
    recorder in the command writes it through its spool); returns its exit code (128 + N
    when a signal N ended it, as a shell reports it)."""
    check_command(command)
    url = run_dir if isinstance(run_dir, str) else None
    created = check_store(url) if url is not None else prepare_run_dir(Path(run_dir))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(boot_dir()), *filter(None, [env.get("PYTHONPATH")])])
    env["TRACEALYZE_RECORD"] = json.dumps(
        {"run_dir": url or str(Path(run_dir).resolve()), "preset": preset,
         "knobs": knobs or {}, "command": list(command)})
    targets: list[int] = []

    def forward(signum: int, _frame: Any) -> None:  # only until the signals are waited for
        _send(targets, signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    # Orphans of the command (a shell script's `python train.py &`) become our children, so
    # that we can wait for them: their recorders are still writing the run.
    subreaper = _become_subreaper()
    try:
        child = subprocess.Popen(list(command), env=env)
        targets.append(child.pid)
        code = _wait(child.poll, targets, child.pid)
        left = _left_running() if subreaper else []
        if left:
            print(f"tracealyze: the command exited ({code}); waiting for the "
                  f"{len(left)} process(es) it left running (pid "
                  f"{', '.join(map(str, left[:8]))})", file=sys.stderr, flush=True)

            def gone() -> int | None:
                targets[:] = _left_running()
                return None if targets else 0

            _wait(gone, targets, None)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    code = 128 - code if code < 0 else code
    if url is not None:
        mark_exit_in_store(url, code)
        return code
    mark_exit(Path(run_dir), code)
    if not (Path(run_dir) / "run.json").exists():
        take_back(created)
    return code


def check_store(url: str) -> list[Path]:
    """One clear error, before the command starts, for a URL that cannot take the run."""
    from tracealyze.format.storage import has_run, list_run, locate

    try:
        stored = list_run(locate(url))
    except (ValueError, OSError) as e:
        raise TracealyzeError(f"cannot record to {url}: {' '.join(str(e).split())[:300]}"
                              ) from None
    if has_run(stored):
        raise TracealyzeError(f"{url} already holds a run; choose another URL")
    return []


def recorded_in(run_dir: Path | str) -> bool:
    """Whether the command's recorder made a run there."""
    if not isinstance(run_dir, str):
        return (run_dir / "run.json").exists()
    from tracealyze.format.storage import has_run, list_run, locate

    try:
        return has_run(list_run(locate(run_dir)))
    except (ValueError, OSError):
        return False


def mark_exit_in_store(url: str, code: int) -> None:
    """:func:`mark_exit` for a run in a store: its run.json read, changed, written back."""
    from tracealyze.format.storage import locate, read_bytes, write_bytes

    try:
        loc = locate(url)
        meta = json.loads(read_bytes(loc, "run.json"))
    except (ValueError, OSError):
        return  # (nothing recorded, or the store is away: the run keeps its own status)
    if isinstance(meta, dict):
        _exit_status(meta, code)
        write_bytes(loc, "run.json", json.dumps(meta, indent=1).encode())


def _send(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def _wait(done: Any, targets: list[int], group_member: int | None) -> int:
    """Wait until ``done()`` gives a code, passing FORWARDED signals on to ``targets``.

    A signal the kernel sent to our foreground process group (a terminal's Ctrl-C) has
    reached the command already when it is in our group: passing it on again is a second
    Ctrl-C, which cut the recorder's save short. Anything else (``kill PID``, a scheduler)
    was meant for us and is passed on. Where ``sigtimedwait`` is missing, every signal is
    passed on (the recorder's save holds a repeated Ctrl-C)."""
    if not hasattr(signal, "sigtimedwait"):  # pragma: no cover - macOS, Windows
        while (code := done()) is None:
            time.sleep(0.05)
        return int(code)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        while (code := done()) is None:
            info = signal.sigtimedwait(FORWARDED, 0.1)
            if info is None:
                continue
            if info.si_code == SI_KERNEL and _in_our_group(group_member):
                continue
            _send(targets, info.si_signo)
        return int(code)
    finally:
        while signal.sigtimedwait(FORWARDED, 0) is not None:
            pass  # handled here: none may reach the default handlers when unblocked
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _in_our_group(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        return os.getpgid(pid) == os.getpgrp()
    except OSError:
        return False


def _become_subreaper() -> bool:
    """Linux: orphaned descendants are reparented to this process (PR_SET_CHILD_SUBREAPER)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _left_running() -> list[int]:
    """Our descendants still running (zombies reaped)."""
    import psutil

    while True:  # reap what has ended
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def mark_exit(run_dir: Path, code: int) -> None:
    """The command's exit code in run.json; a run whose command failed is not completed
    (``sys.exit(3)`` closes it normally inside the script)."""
    from tracealyze.format.parts import write_json_atomic
    from tracealyze.format.runmeta import read_json

    path = run_dir / "run.json"
    meta = read_json(path) if path.exists() else None
    if meta is None:
        return
    _exit_status(meta, code)
    write_json_atomic(path, meta)


def _exit_status(meta: dict[str, Any], code: int) -> None:
    meta["exit_code"] = code
    if code != 0 and meta.get("status") in ("completed", "running"):
        meta["status"] = "crashed"


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
