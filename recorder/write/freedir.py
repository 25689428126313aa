"""A fresh run directory beside an existing one (``runs/exp1`` -> ``runs/exp1-2``, ...), as
TensorBoard and W&B users expect a second run of the same script to be a new run."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tracealyze.format.storage import is_url

from .runmeta import read_json


def free_dir(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ... : the first that holds no earlier run. A run
    another rank of this job just started there (running, begun after this process) is
    this job's own: every rank of a torchrun job lands in the same directory."""
    n = 1
    candidate = path
    while n < 10_000:
        meta = read_json(candidate / "run.json") if (candidate / "run.json").exists() else None
        if meta is None and not (candidate / "run.json").exists():
            return candidate
        if meta is not None and meta.get("status") == "running" and \
                float(meta.get("started") or 0) >= _process_start() - 30:
            return candidate
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def _process_start() -> float:
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:
        return time.time()


def resolve(run_dir: str | os.PathLike[str], if_exists: str, resume: bool
            ) -> str | os.PathLike[str]:
    """The run directory a Recorder opens. ``if_exists="error"`` (the default): ``run_dir``
    itself (a run already there is refused unless ``resume``). ``"new"``: the first of
    ``run_dir``, ``run_dir-2``, ... that holds no earlier run, named on stderr when it is
    not ``run_dir``. ValueError for anything else, or ``"new"`` with ``resume`` or a URL
    (an object store is not listed from the training process)."""
    if if_exists not in ("error", "new"):
        raise ValueError(f"if_exists must be 'error' or 'new', got {if_exists!r}")
    if if_exists == "error" or not isinstance(run_dir, (str, os.PathLike)):
        return run_dir  # (check_arguments names a run_dir of the wrong kind)
    if resume:
        raise ValueError("if_exists='new' starts a new run; resume=True appends to one: "
                         "pass one of them")
    if is_url(str(run_dir)):
        raise ValueError(f"if_exists='new' needs a local run_dir, got {str(run_dir)!r}: "
                         "give each run of an object-store URL its own name")
    path = Path(run_dir)
    fresh = free_dir(path)
    if fresh != path:
        print(f"tracealyze: {path} already holds a run; recording this one to {fresh}",
              file=sys.stderr, flush=True)
    return fresh
