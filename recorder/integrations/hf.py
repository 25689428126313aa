"""Hugging Face ``transformers.Trainer``: one line records the run.

>>> from tracealyze.recorder.integrations.hf import TracealyzeCallback  # doctest: +SKIP
>>> Trainer(model=model, args=args, train_dataset=ds,
...         callbacks=[TracealyzeCallback(preset="standard")]).train()

The run directory is ``<output_dir>/tracealyze`` unless ``run_dir`` is given (a finished run
already there moves the new one to ``tracealyze-2``, ...; ``resume_from_checkpoint``
appends to it). A recorded step is one optimizer step, numbered as the Trainer's
``global_step`` (from 0). What comes from where:

* gradients — after the last micro-batch's backward and, under fp16, after the scaler
  unscaled them, **before clipping**: the norms come from torch's own pass for the clip
  (accelerate calls ``clip_grad_norm_``, or from 1.x ``torch.nn.utils.get_total_norm`` then
  ``clip_grads_with_norm_``), the rest from a hook on the optimizer inside accelerate's
  wrapper;
* loss — the sum over the step's micro-batches of the tensors ``backward()`` ran on (the
  Trainer divides each by the accumulation steps, so this is the step's mean loss; under
  fp16 the loss before scaling);
* learning rate — the optimizer's first group as this step used it (before the scheduler);
* data wait — each batch's wait in the Trainer's train dataloader;
* evaluation and prediction — not recorded as training (no backward runs);
* rank — from ``torch.distributed`` (one folder per rank in one run directory).

The run is closed at ``on_train_end``; a process that exits before it (an exception in
training) leaves the run marked crashed, with the exception when it was not caught.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - exercised without transformers installed
    raise ImportError("tracealyze.recorder.integrations.hf needs transformers "
                      "(pip install transformers accelerate)") from exc

from ._session import Session

__all__ = ["TracealyzeCallback"]


class TracealyzeCallback(TrainerCallback):
    """Records a ``transformers.Trainer`` run with tracealyze.

    ``run_dir``: where to write (default ``<output_dir>/tracealyze``); ``preset``:
    ``"minimal"``, ``"standard"`` or ``"debug"``; any other keyword is a Recorder knob
    (``TracealyzeCallback(grad_norm_every=10)``). A bad preset or knob raises
    ``ValueError`` here, not in the middle of training."""

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, *,
                 preset: str = "standard", **knobs: Any) -> None:
        self.session = Session(run_dir, preset, knobs)

    @property
    def recorder(self) -> Any:
        """The :class:`~tracealyze.recorder.Recorder` of the current run (None before
        training starts): for ``recorder.event(...)`` or ``recorder.watch(...)``."""
        return self.session.rec

    def on_train_begin(self, args: Any, state: Any, control: Any, *, model: Any = None,
                       optimizer: Any = None, train_dataloader: Any = None,
                       **kwargs: Any) -> None:
        self.session.start(
            Path(args.output_dir or ".") / "tracealyze", model=model, optimizer=optimizer,
            scaler=getattr(optimizer, "scaler", None), loader=train_dataloader,
            resuming=state.global_step > 0,
            # TrainingArguments.to_dict() masks the *_token fields; the model's config is
            # its to_dict() (format/hparams.py bounds what a large config holds)
            hparams={"args": args, **({"model": model.config} if getattr(
                model, "config", None) is not None else {})})

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, *,
                              optimizer: Any = None, **kwargs: Any) -> None:
        if optimizer is not None:
            self.session.optimizer_about_to_step(optimizer)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Usually a no-op: the optimizer's pre-hook (or the scaler's unscale_) has read the
        # gradients already. A step the fp16 scaler skipped, or an optimizer accelerate does
        # not step through torch (DeepSpeed), is read here, before zero_grad.
        rec = self.session.rec
        if rec is not None:
            rec.gradients_ready()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.end_step(state.global_step - 1)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.close()
