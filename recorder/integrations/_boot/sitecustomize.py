"""Loaded by every Python process that ``tracealyze record`` starts (its folder is put first
on PYTHONPATH). Standard library only, so a process that never imports torch pays nothing:
it waits for ``torch`` (and the Trainers of transformers and Lightning) to be imported, then
hands over to ``tracealyze.recorder.integrations.auto``. Any ``sitecustomize`` the
environment had is loaded after it, as Python would have."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
_WATCH = {
    "torch": "on_torch",
    "transformers.trainer": "on_transformers_trainer",
    "lightning.pytorch.trainer.trainer": "on_lightning_trainer",
    "pytorch_lightning.trainer.trainer": "on_lightning_trainer",
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``auto.<hook>(module)`` right after one of the watched modules is executed."""

    def __init__(self) -> None:
        self.busy: set[str] = set()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        hook = _WATCH.get(name)
        if hook is None or name in self.busy:
            return None
        self.busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy.discard(name)
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            try:
                from tracealyze.recorder.integrations import auto

                getattr(auto, hook)(module)
            except Exception as exc:  # never break the user's script
                print(f"tracealyze: could not attach to {name} ({type(exc).__name__}: "
                      f"{exc}); the script runs unrecorded", file=sys.stderr)

        loader.exec_module = exec_module
        return spec


if os.environ.get("TRACEALYZE_RECORD"):
    sys.meta_path.insert(0, _AfterImport())


def _chain() -> None:
    """Load the sitecustomize this one shadows, if any."""
    me = sys.modules.get(__name__)
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        sys.modules["sitecustomize"] = me  # as Python does: a failing one is reported
        raise


_chain()
