"""What the framework callbacks share: one recorded training run driven from a framework's
hooks (see :mod:`tracealyze.recorder.lifecycle`), its loss (from ``backward()``), its
learning rate (as the optimizer step used it) and its data-loader wait."""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracealyze.format.hparams import flatten
from tracealyze.format.storage import is_url

from ..config import RecorderConfig
from ..recorder import Recorder
from ..write.freedir import free_dir
from . import _backward
from ._timing import time_batches, time_next


class Session:
    """One recorded run per ``train()``/``fit()`` call. Configuration is checked at
    construction (``ValueError``); nothing after that raises into training except a
    ``run_dir`` the user chose that already holds another run."""

    def __init__(self, run_dir: str | os.PathLike[str] | None, preset: str,
                 knobs: dict[str, Any]) -> None:
        if run_dir is not None and (not isinstance(run_dir, (str, os.PathLike))
                                    or str(run_dir) == ""):
            raise ValueError(f"run_dir must be a path or None, got {run_dir!r}")
        knobs = dict(knobs)
        # The user's own hyperparameters (callback(hparams=...)): checked now, added to the
        # framework's at the start of each run
        user = knobs.pop("hparams", None)
        self.hparams = flatten(user)[0] if user is not None else {}
        config = RecorderConfig.from_preset(preset, **knobs)  # ValueError: bad preset/knob
        self.sample_ids = config.enabled and config.record_sample_ids
        self.run_dir = run_dir
        self.preset = preset
        self.knobs = knobs
        self.rec: Recorder | None = None
        self.loss = _backward.StepLoss()
        self.lr: float | None = None
        self._undo: list[Callable[[], None]] = []
        # How a run still open when the interpreter exits is closed: a framework's run
        # that never reached its end-of-training hook crashed; a plain script under
        # ``tracealyze record`` that exits has finished (an uncaught exception is marked
        # crashed by the Recorder's excepthook before this runs).
        self.exit_status = "crashed"

    @property
    def active(self) -> bool:
        return self.rec is not None and not self.rec._closed

    def start(self, default_dir: Path, *, model: Any, optimizer: Any = None, scaler: Any = None,
              loader: Any = None, fetcher: Any = None, drawn: Any = None,
              resuming: bool = False, capture_loss: bool = True,
              hparams: dict[str, Any] | None = None) -> Recorder:
        """Open the run: ``run_dir`` if given, else ``default_dir`` (or the first free
        ``default_dir-N`` when a finished run is there and training is not resuming).
        ``fetcher``: an iterator-like object the framework calls ``next()`` on (timed
        instead of ``loader``), ``drawn`` the sampler tap of its loader (its sample ids);
        ``hparams``: what the framework says the run was configured to do (the user's own,
        given to the callback, win where a key is in both)."""
        if self.rec is not None:
            self.close()
        if model is None:
            raise ValueError("tracealyze: the framework handed the callback no model; "
                             "nothing to record")
        if self.run_dir is not None:  # (a URL stays text: Path folds s3://b into s3:/b)
            path = self.run_dir if is_url(str(self.run_dir)) else Path(self.run_dir)
        else:
            path = default_dir if resuming else free_dir(default_dir)
        resume = resuming and (is_url(str(path)) or (Path(path) / "run.json").exists())
        try:
            hp, _ = flatten(hparams or {})
        except Exception:  # (a framework's odd config must not stop training)
            hp = {}
        self.rec = rec = Recorder(path, model=model, optimizer=optimizer, scaler=scaler,
                                  preset=self.preset, resume=resume,
                                  hparams={**hp, **self.hparams}, **self.knobs)
        if not rec.config.enabled:
            return rec
        self._undo = []
        if capture_loss:  # (else the caller feeds self.loss)
            _backward.install(id(self), self.loss.add)
            self._undo.append(lambda: _backward.uninstall(id(self)))
        undo = time_next(fetcher, rec.data_wait_ended, drawn) if fetcher is not None else \
            time_batches(loader, rec.data_wait_ended, rec.config.record_sample_ids)
        if undo is not None:
            self._undo.append(undo)
        # atexit runs last-registered first: before the Recorder's own (which would call
        # the run completed). A process that exits without the framework's end-of-training
        # hook did not finish training.
        atexit.register(self._exit)
        self._undo.append(lambda: atexit.unregister(self._exit))
        return rec

    def optimizer_about_to_step(self, optimizer: Any) -> None:
        """Remember the learning rate this optimizer step uses (schedulers change it
        right after the step, before the frameworks' end-of-step hooks)."""
        try:
            self.lr = float(optimizer.param_groups[0]["lr"])
        except Exception:
            self.lr = None

    def end_step(self, step: int | None) -> None:
        rec = self.rec
        if rec is None:
            return
        rec.step(self.loss.take(), step=step, lr=self.lr)
        self.lr = None

    def close(self, status: str | None = None) -> None:
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception:
                pass
        self._undo = []
        if self.rec is not None:
            self.rec.close(status)

    def _exit(self) -> None:
        if self.active:
            self.close(self.exit_status)

