"""What ``tracealyze record -- python train.py`` runs inside the unmodified script.

The configuration comes from the environment variable ``TRACEALYZE_RECORD`` (JSON:
``run_dir``, ``preset``, ``knobs``), set by the CLI. Three cases:

* **transformers / Lightning** — each ``Trainer`` created gets the framework's
  ``TracealyzeCallback`` added (see :mod:`.hf`, :mod:`.lightning`): their steps, losses and
  gradients are taken exactly as with the callback written by hand. The optimizer hooks
  below then stand aside.
* **a plain loop** — global optimizer step hooks (``torch.optim``'s
  ``register_optimizer_step_pre_hook``/``post_hook``): at the first ``optimizer.step()`` the
  model is found (the module holding most of that optimizer's parameters, found once among
  the live objects), the run opens, and from then on each step of that optimizer is one
  recorded step: gradients read in its pre-hook (after backward; before the update), the loss
  from ``backward()`` (see :mod:`._backward`), the learning rate as the step used it, and the
  data wait of ``torch.utils.data.DataLoader`` iterations made with autograd enabled (an
  evaluation loop under ``no_grad`` is not training). Other optimizers stepped in the same
  process (a GAN's second) are noted once in an event, not counted as steps.
* **no optimizer ever steps** — nothing is written.

Under ``torchrun`` every rank records into the same run directory (one folder per rank).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
import warnings
from typing import Any

_state: dict[str, Any] = {"session": None, "clock": None, "frameworks": 0, "others": set(),
                          "config": None, "failed": False, "wait": 0.0, "loss": None}
_lock = threading.Lock()


def config() -> dict[str, Any]:
    if _state["config"] is None:
        raw = os.environ.get("TRACEALYZE_RECORD", "{}")
        try:
            _state["config"] = dict(json.loads(raw))
        except ValueError:
            _state["config"] = {}
    return _state["config"]


def _callback_kwargs() -> dict[str, Any]:
    cfg = config()
    return {"run_dir": cfg.get("run_dir"), "preset": cfg.get("preset", "standard"),
            **_knobs(cfg)}


def _knobs(cfg: dict[str, Any]) -> dict[str, Any]:
    """The knobs given to ``tracealyze record``, and the command line it ran as the run's
    hyperparameters (``command``, ``cli.<option>``)."""
    from tracealyze.format.hparams import from_command

    return {**(cfg.get("knobs") or {}), "hparams": from_command(cfg.get("command"))}


# ---------------------------------------------------------------------- frameworks
def on_transformers_trainer(module: Any) -> None:
    trainer_cls = module.Trainer
    original = trainer_cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        from .hf import TracealyzeCallback

        self.add_callback(TracealyzeCallback(**_callback_kwargs()))
        _state["frameworks"] += 1

    trainer_cls.__init__ = __init__


def on_lightning_trainer(module: Any) -> None:
    trainer_cls = module.Trainer
    original = trainer_cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        from .lightning import TracealyzeCallback

        callbacks = kwargs.get("callbacks")
        if callbacks is not None and not isinstance(callbacks, list):
            callbacks = [callbacks]
        kwargs["callbacks"] = [*(callbacks or []), TracealyzeCallback(**_callback_kwargs())]
        _state["frameworks"] += 1
        original(self, *args, **kwargs)

    trainer_cls.__init__ = __init__


# ---------------------------------------------------------------------- plain loops
def on_torch(torch: Any) -> None:
    """torch was just imported: hook every optimizer's steps (cheap until one steps)."""
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    from . import _backward

    register_optimizer_step_pre_hook(_pre)
    register_optimizer_step_post_hook(_post)
    _time_data_loaders(torch)
    # From the start: the first step's backward and batch come before its optimizer step,
    # where the run opens.
    _state["loss"] = loss = _backward.StepLoss()
    # (any thread: torch is imported before anyone knows which thread will train)
    _backward.install(id(_state), lambda t: None if _state["frameworks"] else loss.add(t),
                      any_thread=True)


def _pre(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _state["frameworks"] or _state["failed"]:
        return
    try:
        if _state["clock"] is None:
            with _lock:
                if _state["clock"] is None:
                    _open(optimizer)
        if optimizer is _state["clock"]:
            session = _state["session"]
            session.rec.gradients_ready()
            session.optimizer_about_to_step(optimizer)
        elif id(optimizer) not in _state["others"]:
            _state["others"].add(id(optimizer))
            session = _state["session"]
            if session is not None and session.rec is not None:
                session.rec.event(
                    "optimizer_ignored", f"a second optimizer ({type(optimizer).__name__}) "
                    "steps in this process; the recorded steps are the first one's",
                    severity="info")
    except Exception as exc:
        _give_up(exc)


def _post(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _state["frameworks"] or _state["failed"] or optimizer is not _state["clock"]:
        return
    try:
        session = _state["session"]
        session.rec.optimizer_stepped()
        session.end_step(None)
    except Exception as exc:
        _give_up(exc)


def _open(optimizer: Any) -> None:
    from pathlib import Path

    from ._session import Session

    cfg = config()
    model = find_model(optimizer)
    session = Session(cfg.get("run_dir") or "tracealyze-run", cfg.get("preset", "standard"),
                      _knobs(cfg))
    session.exit_status = "completed"  # a script that returns normally finished its run
    session.loss = _state["loss"]
    rec = session.start(Path(cfg.get("run_dir") or "tracealyze-run"), model=model,
                        capture_loss=False)
    if _state["wait"]:
        rec.data_wait_ended(_state["wait"])
    _state["session"] = session
    _state["clock"] = optimizer


def _give_up(exc: BaseException) -> None:
    _state["failed"] = True
    print(f"tracealyze: recording stopped ({type(exc).__name__}: {exc}); training goes on",
          file=sys.stderr)


def find_model(optimizer: Any) -> Any:
    """The module whose parameters the optimizer holds: among live ``nn.Module`` objects,
    the one holding the most of them (the smallest such, so that a container of several
    models is not taken for the model when the model itself holds them all; of a model and
    its DDP/compile wrappers, the outermost). A one-time scan of the garbage collector's
    objects, at the first step."""
    from torch import nn

    wanted = {id(p) for g in optimizer.param_groups for p in g["params"]}
    best, best_key = None, None
    with warnings.catch_warnings():  # (isinstance on some objects warns of deprecations)
        warnings.simplefilter("ignore")
        modules = [obj for obj in gc.get_objects() if isinstance(obj, nn.Module)]
    for obj in modules:
        try:
            ids = [id(p) for p in obj.parameters()]
        except Exception:
            continue
        held = sum(1 for i in ids if i in wanted)
        if held == 0:
            continue
        key = (held, -len(ids), _wrapper_rank(obj))
        if best_key is None or key > best_key:
            best, best_key = obj, key
    if best is None:
        raise ValueError("no torch.nn.Module holds the optimizer's parameters")
    return best


def _wrapper_rank(module: Any) -> int:
    """Among modules holding the same parameters, the outermost wrapper is taken: the
    Recorder unwraps it to the user's module, and learns from it that the run is DDP (whose
    ranks hold the same gradients) or compiled (no activation tracing)."""
    return {"DistributedDataParallel": 2, "DataParallel": 2,
            "OptimizedModule": 1}.get(type(module).__name__, 0)


def _time_data_loaders(torch: Any) -> None:
    """Every DataLoader's batches, timed while autograd is enabled (a training loop)."""
    cls = torch.utils.data.DataLoader
    base_iter = cls.__iter__

    def __iter__(self: Any) -> Any:
        it = base_iter(self)
        if _state["frameworks"] or not torch.is_grad_enabled():
            return it
        return _Timed(it, torch)

    cls.__iter__ = __iter__


class _Timed:
    """A DataLoader iterator whose ``next()`` reports its wait to the open run."""

    def __init__(self, it: Any, torch: Any) -> None:
        self._it = it
        self._torch = torch

    def __iter__(self) -> _Timed:
        return self

    def __len__(self) -> int:
        return len(self._it)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)

    def __next__(self) -> Any:
        t0 = time.perf_counter()
        batch = next(self._it)
        if self._torch.is_grad_enabled():
            session = _state["session"]
            if session is not None and session.rec is not None:
                session.rec.data_wait_ended(time.perf_counter() - t0, batch)
            elif session is None:
                _state["wait"] += time.perf_counter() - t0  # before the run opened
        return batch
