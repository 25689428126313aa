"""PyTorch Lightning (``lightning.pytorch`` and ``pytorch_lightning``): one line records the
run.

>>> from tracealyze.recorder.integrations.lightning import TracealyzeCallback  # doctest: +SKIP
>>> L.Trainer(max_steps=1000, callbacks=[TracealyzeCallback()]).fit(module, loader)

The run directory is ``<trainer.log_dir>/tracealyze`` unless ``run_dir`` is given. A
recorded step is one optimizer step, numbered as ``trainer.global_step`` (from 0).

Lightning runs forward and backward inside ``optimizer.step(closure)``, so an optimizer hook
would read the previous step's gradients. The callback reads them in
``on_before_optimizer_step``: after the closure's backward (the last micro-batch's, with
``accumulate_grad_batches``), after AMP unscaling, before Lightning clips. The loss is
the sum over the step's micro-batches of the tensors ``backward()`` ran on (Lightning divides
each by the accumulation count: the step's mean loss; under AMP, before scaling). The
learning rate is the first optimizer's as the step used it; the data wait is timed around
the fit loop's ``next()`` on its data fetcher. Validation, test and predict loops are not
recorded as training. ``on_exception`` closes the run as crashed, with the exception.

The class subclasses the ``Callback`` of whichever of ``lightning.pytorch`` and
``pytorch_lightning`` are installed (both when both are), so either Trainer accepts it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ._session import Session

__all__ = ["TracealyzeCallback"]


def _bases() -> tuple[type, ...]:
    bases: list[type] = []
    try:
        from lightning.pytorch import Callback as LCallback

        bases.append(LCallback)
    except ImportError:
        pass
    try:
        from pytorch_lightning import Callback as PLCallback

        bases.append(PLCallback)
    except ImportError:
        pass
    if not bases:
        raise ImportError("tracealyze.recorder.integrations.lightning needs lightning "
                          "(pip install lightning) or pytorch_lightning")
    return tuple(bases)


class TracealyzeCallback(*_bases()):  # type: ignore[misc]
    """Records a Lightning ``Trainer.fit`` with tracealyze.

    ``run_dir``: where to write (default ``<trainer.log_dir>/tracealyze``); ``preset``:
    ``"minimal"``, ``"standard"`` or ``"debug"``; any other keyword is a Recorder knob. A bad
    preset or knob raises ``ValueError`` here, not in the middle of training."""

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, *,
                 preset: str = "standard", **knobs: Any) -> None:
        super().__init__()
        self.session = Session(run_dir, preset, knobs)
        self._stepped = False

    @property
    def recorder(self) -> Any:
        """The :class:`~tracealyze.recorder.Recorder` of the current run (None before
        ``fit`` starts training)."""
        return self.session.rec

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        root = trainer.log_dir or trainer.default_root_dir or "."
        loader = trainer.train_dataloader
        self.session.start(
            Path(root) / "tracealyze", model=pl_module,
            # The fit loop made its loader iterator before any callback runs: the data
            # fetcher (private; its next() is the wait) is timed, else the loader from its
            # next epoch on.
            fetcher=getattr(trainer.fit_loop, "_data_fetcher", None),
            drawn=_sample_tap(trainer) if self.session.sample_ids else None,
            loader=loader if _is_loader(loader) else None,
            resuming=trainer.global_step > 0, hparams=_hparams(trainer, pl_module))
        self._stepped = False

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        rec = self.session.rec
        if rec is None or self._stepped:  # (a second optimizer: the first one's step)
            return
        rec.gradients_ready()
        self.session.optimizer_about_to_step(optimizer)
        self._stepped = True

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        rec = self.session.rec
        if rec is None or not self._stepped:
            return  # a micro-batch of gradient accumulation: the step goes on
        self._stepped = False
        rec.optimizer_stepped()
        self.session.end_step(trainer.global_step - 1)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.session.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        rec = self.session.rec
        if rec is not None and not rec._closed:
            rec._record_exception(exception)
            self.session.close("crashed")


def _sample_tap(trainer: Any) -> Any:
    """The tap of the training DataLoader's sampler (record_sample_ids): its sample ids per
    batch the data fetcher delivers. The fit loop's first iterator exists already, with the
    fetcher's prefetched batch (and a worker iterator's, sent ahead) drawn: those batches
    go unnamed, the rest of the epoch is tapped in place, and every later epoch's iterator
    draws through the tap. Lightning's private fetcher and combined loader are read only
    as far as they are what is expected (one DataLoader under the prefetching fetcher);
    otherwise None: no ids, never ids paired with the wrong batch."""
    from ..training.samples import in_flight, install, tap_running

    try:
        fetcher = trainer.fit_loop._data_fetcher
        prefetched = getattr(fetcher, "batches", None)
        if type(fetcher).__name__ != "_PrefetchDataFetcher" or type(prefetched) is not list:
            return None
        combined = fetcher.combined_loader
        iterators = getattr(getattr(combined, "_iterator", None), "iterators", None)
        if len(combined.flattened) != 1 or type(iterators) is not list or len(iterators) != 1:
            return None
        tap = install(combined.flattened[0])
        if tap is None:
            return None
        ahead = in_flight(iterators[0])
        if ahead is None or not tap_running(iterators[0], tap, ahead + len(prefetched)):
            tap.drawn.clear()  # (this epoch unnamed; the next iterator draws through the tap)
        return tap
    except Exception:  # Lightning's internals moved: no sample ids
        return None


def _is_loader(loader: Any) -> bool:
    return loader is not None and hasattr(type(loader), "__iter__") and \
        not isinstance(loader, (list, tuple, dict))


def _hparams(trainer: Any, pl_module: Any) -> dict[str, Any]:
    """What the run was configured to do: the module's ``hparams`` (save_hyperparameters),
    the datamodule's, and the trainer's settings that change training."""
    dm = getattr(trainer, "datamodule", None)
    settings = {k: getattr(trainer, k, None) for k in (
        "max_epochs", "max_steps", "accumulate_grad_batches", "precision",
        "gradient_clip_val", "gradient_clip_algorithm", "world_size", "num_devices")}
    out = {"model": dict(getattr(pl_module, "hparams", None) or {}),
           "data": dict(getattr(dm, "hparams", None) or {}), "trainer": settings}
    return {k: v for k, v in out.items() if v}
