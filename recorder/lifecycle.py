"""The step lifecycle of a :class:`~tracealyze.recorder.Recorder`.

A recorded step is one optimizer step. Four public calls mark its phases; a plain loop needs
only ``rec.step()`` (and ``wrap_loader``), because the recorder drives the others from hooks on
the optimizer (and on ``GradScaler.unscale_``). A framework integration, or a loop without a
``torch.optim`` optimizer, drives them itself, in this order, once per optimizer step:

1. :meth:`StepLifecycle.data_wait_ended` — the batch arrived after waiting ``seconds``
   (``wrap_loader`` calls it);
2. :meth:`StepLifecycle.gradients_ready` — backward (all micro-batches) and any unscaling are
   done and the optimizer has not changed the weights yet: gradients are read now (the
   optimizer pre-hook calls it);
3. :meth:`StepLifecycle.optimizer_stepped` — the weights were updated (optimizer post-hook);
4. :meth:`StepLifecycle.step_ended` — the step is over: loss, lr and metrics are attached and
   the step is committed (``rec.step()`` is this call). Called several times before the
   optimizer steps (gradient accumulation), the calls are folded into one step.

Each call is cheap, never syncs with the device, and never raises.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from .activations import join_pieces
from .capture import StepAccum, pack
from .gradients import due
from .hooks import is_compiling
from .rows import StepItem
from .stepstate import StepMachine


class StepLifecycle:
    """The lifecycle half of the Recorder (state is set up by ``Recorder.__init__``)."""

    # Set by Recorder.__init__ (declared for readers and type checkers).
    _closed: bool
    _steps: StepMachine  # the open and the pending step (see stepstate)
    _grad_rows: bool
    _batch_noted: bool
    _lock: Any  # threading.RLock: the public calls may come from several threads
    _train_thread: int | None  # ident of the thread that trains (see step())
    _side_noted: bool

    def step(self, loss: Any = None, *, step: int | None = None, lr: Any = None,
             **metrics: Any) -> None:
        """End one recorded step (:meth:`step_ended`). Values may be Python numbers or
        tensors on any device; tensors are read later, without a host-device sync.
        ``lr`` defaults to the optimizer's first param group."""
        if self._closed or is_compiling():
            return
        if not self._training_thread():
            self._guard("step", self._side_values, loss, metrics)
            return
        self._guard("step", self._step_ended, loss, step, lr, metrics)

    def _training_thread(self) -> bool:
        """Whether this thread trains: the one the optimizer steps in (its pre-hook says;
        until it first fires, the thread that made the recorder), else, without an
        optimizer, the first to call step()."""
        me = threading.get_ident()
        if self._train_thread is None:
            self._train_thread = me
        return me == self._train_thread

    def _side_values(self, loss: Any, metrics: dict[str, Any]) -> None:
        """step() from another thread (a logger, a monitor) must not end the training
        thread's step under it: its values join the open step as metrics (a loss as the
        metric ``loss``), and the training thread ends the step."""
        if loss is not None:
            metrics = {"loss": loss, **metrics}
        with self._lock:
            acc = self._acc
            bad = [(str(k), v) for k, v in metrics.items()
                   if not acc.add_scalar("metric", v, metric=str(k))]
            if bad:
                self._drop_values(acc.step, bad)
        if not self._side_noted:
            self._side_noted = True
            self.event("step_from_another_thread",
                       f"rec.step() was called from thread {threading.current_thread().name}, "
                       "not the training thread: its values are added to the open step as "
                       "metrics, and the training thread ends the step", severity="info")

    def step_ended(self, loss: Any = None, *, step: int | None = None, lr: Any = None,
                   **metrics: Any) -> None:
        """Lifecycle 4: the step is over. Same as :meth:`step`."""
        self.step(loss, step=step, lr=lr, **metrics)

    def data_wait_ended(self, seconds: float, batch: Any = None) -> None:
        """Lifecycle 1: the open step waited ``seconds`` for its data (added up over
        micro-batches; recorded as ``data_wait_s``). ``batch``, when given: the batch that
        arrived; the first one's leading dimension is kept as run.json's
        ``data.batch_size`` (per rank), so that ``compare`` can tell runs apart that
        differ in batch size."""
        if not self._closed:
            with self._lock:  # (a loader thread may call this while the step ends)
                acc = self._acc
                acc.data_wait_s += seconds
                acc.waited = True
                if acc.data_ready is None:
                    acc.data_ready = time.perf_counter()
            if batch is not None and not self._batch_noted:
                self._batch_noted = True
                self._guard("batch size", self._note_batch, batch)

    def gradients_ready(self) -> None:
        """Lifecycle 2: gradients are final for this optimizer step and the weights are not
        updated yet: read the gradient statistics that are due (and copy the weights at the
        update-ratio cadence). Idempotent within a step."""
        if self._closed or is_compiling():
            return
        self._guard("gradients_ready", self._before_update)

    def optimizer_stepped(self) -> None:
        """Lifecycle 3: the optimizer updated the weights (update ratios; a step whose
        :meth:`step_ended` came first is committed now)."""
        if self._closed or is_compiling():
            return
        self._guard("optimizer_stepped", self._after_update)

    @property
    def _acc(self) -> StepAccum:
        """The open step (collecting values now)."""
        return self._steps.open

    def _step_ended(self, loss: Any, step: int | None, lr: Any,
                    metrics: dict[str, Any]) -> None:
        with self._lock:
            now = time.time()
            acc = self._steps.values_step()
            if step is not None:
                acc.step = int(step)
            bad = [] if acc.add_scalar("loss", loss) else [("loss", loss)]
            if lr is None and self.optimizer is not None:
                lr = self.optimizer.param_groups[0].get("lr")
            if lr is not None and not acc.has("lr") and not acc.add_scalar("lr", lr):
                bad.append(("lr", lr))
            for name, value in metrics.items():
                if not acc.add_scalar("metric", value, metric=str(name)):
                    bad.append((str(name), value))
            if bad:
                self._drop_values(acc.step, bad)
            if self.scaler is not None:
                acc.scaler = True
                if not acc.has("loss_scale"):  # unscale_ was not called: read it now
                    self._capture_scale(acc)
            acc.ended = now
            acc.duration_s = now - self._last_end
            self._last_end = now
            # Complete when its gradients were read; without an optimizer they are read
            # here. With one that has not stepped yet (rec.step() before opt.step()), its
            # hooks attach the gradients (and update ratios), then the step commits.
            complete = acc.grads_captured or (self.optimizer is None and self.scaler is None)
            if complete and not acc.grads_captured:
                self._reader.capture(acc)
            nxt = self._steps.ended(acc, complete=complete)
            if self._act is not None and self.config.activation_stats_every:
                self._act.next_step(nxt.step)
            if self._profiler is not None:
                self._profiler.after_step()
                self._profiler.before_step(nxt.step)

    def _drop_values(self, step: int, bad: list[tuple[str, Any]]) -> None:
        """rec.step() values that are not numbers: dropped one by one (the step and its number
        stay), counted as dropped ``step_values``, reported once."""
        self._writer.dropped["step_values"] += len(bad)
        if not self.guard.once("step_values"):
            return
        name, value = bad[0]
        what = f"{type(value).__name__} {str(value)[:60]!r}"
        print(f"tracealyze: rec.step() value {name}={what} is not a number; dropped (the step "
              "is kept; further bad values are only counted)", file=sys.stderr)
        self.event("dropped_data", f"rec.step() value {name!r} is not a real number ({what}); "
                   "it was dropped, the step kept", severity="warning", subject=name,
                   step_values=len(bad))

    def _hook_target(self) -> StepAccum:
        """The step an optimizer/scaler hook belongs to: the pending one when rec.step()
        came first, else the open one."""
        return self._steps.target()

    def _gradients_ready(self) -> None:
        with self._lock:
            target = self._hook_target()
            if not target.grads_captured:
                self._reader.capture(target)
                self._steps.gradients_read(target)

    def _clip_sink(self, tensors: list[Any]) -> Any:
        """clip_grad_norm_ is about to norm ``tensors`` (see :mod:`.clipping`): if they are
        this model's gradients, still unread this step, a sink for their norms."""
        if self._closed:
            return None
        with self._lock:
            target = self._hook_target()
            if target.grads_captured or target.norms_read:
                return None
            return self._reader.clip_sink(target, tensors)

    def _grad_landed(self, _param: Any) -> None:
        """A watched parameter's gradient was accumulated (distributed runs; see
        Recorder._watch_compute): host time only, no device work."""
        self._acc.grad_ready = time.perf_counter()

    def _clip_max(self, max_norm: float) -> None:
        # clip_grad_norm_(..., inf) only measures (transformers does so every step when
        # max_grad_norm is 0): no clipping threshold to record.
        if not self._closed and max_norm < float("inf"):
            self._hook_target().floats["grad_clip"] = [max_norm]

    def _before_update(self) -> None:
        self._train_thread = threading.get_ident()  # the optimizer steps where training runs
        self._gradients_ready()
        target = self._hook_target()
        # Once a step: a framework may call gradients_ready() again after the update (the
        # transformers callback does), when a copy would be of the updated weights.
        if self.config.update_ratio_every and not target.snapshotted:
            target.snapshotted = True
            self._reader.snapshot_params(target.step)

    def _after_update(self) -> None:
        if self._reader.snapshot is not None:
            self._guard("optimizer_hook", self._reader.update_ratio, self._hook_target())
        if self._steps.pending is None:
            return  # rec.step() comes after opt.step() (the usual order): it commits
        with self._lock:
            self._steps.optimizer_stepped()

    def _capture_scale(self, acc: StepAccum | None = None) -> None:
        if self._amp is not None:
            self._amp.capture_scale(acc if acc is not None else self._hook_target())

    # The optimizer hooks run right after backward and right after the optimizer step, when
    # the interpreter's caches are cold: each Python call there costs several times what it
    # does in a loop. So each hook is one guarded call that checks what is due first.
    def _on_opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if is_compiling():  # a compiled optimizer step: telemetry must not break the graph
            return
        try:
            self._before_update()
        except Exception as exc:
            self._count_error("optimizer_hook", exc)

    def _on_opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if is_compiling():
            return
        try:
            self._after_update()
        except Exception as exc:
            self._count_error("optimizer_hook", exc)

    def _commit(self, acc: StepAccum) -> None:
        if self._act is not None and not self._act.traced:
            why = self._act.untraced(acc)
            if why is not None:
                self.event("activation_tracing_unavailable", why, severity="info")
        join_pieces(acc)
        host, event = pack(acc)
        memory = due(self.config.memory_every, acc.step)
        item = StepItem(
            step=acc.step, time=acc.ended or time.time(), duration_s=acc.duration_s,
            data_wait_s=acc.data_wait_s if acc.waited else None,
            floats=acc.floats, metrics=acc.metrics, pieces=acc.pieces, host=host, event=event,
            scaler=acc.scaler, memory=memory, rss=self._probe.rss() if memory else None,
            heap=self._probe.heap() if memory else None,
            store_grad_norms=self.config.store_grad_norms and self._grad_rows,
            compute_s=_compute_s(acc),
        )
        self._next_step = acc.step + 1
        self._rundir.step_committed()
        self._writer.submit(item, "steps")



def _compute_s(acc: StepAccum) -> float | None:
    """Distributed runs: the rank's own work before the all-reduce wait, from its batch's
    arrival (or, without a wrapped loader, the previous step's end) to its last watched
    gradient. None where no gradient hook fired (single-process runs)."""
    if acc.grad_ready is None:
        return None
    start = acc.data_ready if acc.data_ready is not None else acc.opened
    return acc.grad_ready - start if acc.grad_ready > start else None
