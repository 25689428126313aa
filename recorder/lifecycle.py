"""The step lifecycle of a :class:`~tracealyze.recorder.Recorder`.

A recorded step is one optimizer step. Four public calls mark its phases; a plain loop needs
only ``rec.step()`` (and ``wrap_loader``), because the recorder drives the others from hooks on
the optimizer (and on ``GradScaler.unscale_``). A framework integration, or a loop without a
``torch.optim`` optimizer, drives them itself, in this order, once per optimizer step:

1. ``rec.data_wait_ended(seconds)`` — the batch arrived after waiting ``seconds``
   (``wrap_loader`` calls it);
2. ``rec.gradients_ready()`` — backward (all micro-batches) and any unscaling are done and
   the optimizer has not changed the weights yet: gradients are read now (the optimizer
   pre-hook calls it);
3. ``rec.optimizer_stepped()`` — the weights were updated (optimizer post-hook);
4. ``rec.step_ended(...)`` — the step is over: loss, lr and metrics are attached and the
   step is committed (``rec.step()`` is this call). Called several times before the
   optimizer steps (gradient accumulation), the calls are folded into one step.

Each call is cheap, never syncs with the device, and never raises.
:class:`StepLifecycle` is the collaborator that carries these calls out: the Recorder makes one in
its constructor from the parts it wires (the gradient reader, the writer, the memory probe, the run
directory) and forwards its public lifecycle calls and the optimizer, scaler and clipping hooks to
it. The open and the pending step live in its :class:`~.stepstate.StepMachine`; the committed step
leaves it as a :class:`~.capture.StepItem` (plain data) for the writer.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .capture import Piece, StepAccum, StepItem, lr_now, pack, watchable
from .config import RecorderConfig
from .live.guard import Guard
from .stepstate import StepMachine
from .tensors.activations import ActivationCapture, join_pieces
from .tensors.amp import ScalerHook
from .tensors.gradients import GradReader, due
from .tensors.hooks import is_compiling
from .training.cpuclock import StepClock
from .training.loader import batch_size_of
from .training.profiling import ProfilerSchedule
from .training.sampler import MemoryProbe
from .training.samples import MAX_IDS
from .training.shapes import ShapeLog
from .training.throughput import FlopMeter, step_rates, tokens_of
from .write.buffers import held_bytes
from .write.rundir import RunDir
from .write.writer import Writer


class StepLifecycle:
    """The step lifecycle of one Recorder: what each lifecycle call and hook does to the
    open step, and the commit of a finished one. Every entry point checks ``closed`` first
    and runs guarded (a failure is counted and recorded, never raised into training)."""

    def __init__(self, *, config: RecorderConfig, first_step: int, optimizer: Any,
                 scaler: Any, reader: GradReader, writer: Writer, probe: MemoryProbe,
                 rundir: RunDir, guard: Guard, call: Callable[..., Any],
                 count_error: Callable[[str, BaseException], None],
                 event: Callable[..., None], lock: Any, grad_rows: bool) -> None:
        """``call(where, fn, *args)`` and ``count_error(where, exc)``: the Recorder's guarded
        call and failure count (one Guard, one ``recorder_error`` event per failure)."""
        self.config = config
        self.optimizer = optimizer
        self.scaler = scaler
        self._reader = reader
        self._writer = writer
        self._probe = probe
        self._rundir = rundir
        self.guard = guard
        self._guard = call
        self._count_error = count_error
        self.event = event
        self._lock = lock  # the Recorder's RLock: the calls may come from several threads
        self._grad_rows = grad_rows  # this rank writes per-parameter gradient rows
        self.closed = False
        self.next_step = first_step  # the number after the last committed step
        self._steps = StepMachine(first_step, reader.signature, self.commit)
        self._last_end = time.time()
        self._clock = StepClock()  # the step's host CPU and run-queue time (cpuclock.py)
        self._batch_noted = False
        self.shapes = ShapeLog()
        # with an optimizer: this thread until its pre-hook says where training runs
        self._train_thread: int | None = (threading.get_ident() if optimizer is not None
                                          else None)
        self._side_noted = False
        # set by the Recorder once it has made them (they need this object's open step)
        self.act: ActivationCapture | None = None
        self.amp: ScalerHook | None = None
        self.profiler: ProfilerSchedule | None = None
        self.flops: FlopMeter | None = None
        self.anomaly: Any = None  # anomaly.AnomalyWindow (anomaly_mode="after_nonfinite")
        self.tree: Any = None  # model_tree.ModelWatch
        self.structure: Any = None  # structure.StructureProbe, until the first step ends

    def step(self, loss: Any = None, *, step: int | None = None, lr: Any = None,
             tokens: int | None = None, **metrics: Any) -> None:
        """End one recorded step (``rec.step()``): see :class:`~.recorder.Recorder`."""
        if self.closed or is_compiling():
            return
        if not self._training_thread():
            self._guard("step", self._side_values, loss, metrics)
            return
        self._guard("step", self._step_ended, loss, step, lr, metrics, tokens)

    def watch(self, name: str, tensor: Any) -> None:
        """``rec.watch``: statistics of any tensor at the open step (kind ``watch``)."""
        tensor = watchable(str(name), tensor)  # ValueError: only this watch is left out
        stats = self._reader.full.one(tensor)
        with self._lock:  # another thread may be ending the step (its accumulator swapped)
            self.acc.add(Piece("watch", 8, (str(name),), (tensor.numel(),)), stats)

    def _training_thread(self) -> bool:
        """Whether this thread trains: the one the optimizer steps in (its pre-hook says;
        until it first fires, the thread that made the recorder), else, without an
        optimizer, the first to call step()."""
        me = threading.get_ident()
        if self._train_thread is None:
            self._train_thread = me
        return me == self._train_thread

    def _side_values(self, loss: Any, metrics: dict[str, Any]) -> None:
        """step() from another thread (a logger, a monitor) must not end the training thread's
        step: its values join the open step as metrics (a loss as ``loss``)."""
        if loss is not None:
            metrics = {"loss": loss, **metrics}
        with self._lock:
            acc = self.acc
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

    def data_wait_ended(self, seconds: float, batch: Any = None,
                        sample_ids: list[int] | None = None) -> None:
        """Lifecycle 1: the open step waited ``seconds`` for its data (added up over
        micro-batches; recorded as ``data_wait_s``). ``batch``, when given: the batch that
        arrived; the first one's leading dimension is kept as run.json's
        ``data.batch_size`` (per rank), so that ``compare`` can tell runs apart that
        differ in batch size."""
        if not self.closed:
            with self._lock:  # (a loader thread may call this while the step ends)
                acc = self.acc
                acc.data_wait_s += seconds
                if sample_ids is not None and len(acc.sample_ids or ()) < MAX_IDS:
                    acc.sample_ids = ((acc.sample_ids or []) + list(sample_ids))[:MAX_IDS]
                acc.waited = True
                if acc.data_ready is None:
                    acc.data_ready = time.perf_counter()
            if batch is not None:  # (shapes only: throughput)
                self._guard("batch shape", self._count_batch, acc, batch)
            if batch is not None and not self._batch_noted:
                self._batch_noted = True
                self._guard("batch size", self._note_batch, batch)

    def _count_batch(self, acc: StepAccum, batch: Any) -> None:
        self.shapes.count(acc, batch)  # (new input shapes: per-shape caches, shapes.py)
        n, t = batch_size_of(batch), tokens_of(batch)
        if n is not None:
            acc.samples = (acc.samples or 0) + n
        if t is not None:
            acc.tokens = (acc.tokens or 0) + t

    def _note_batch(self, batch: Any) -> None:
        """run.json's ``data.batch_size`` (with the next heartbeat): a shape read only."""
        n = batch_size_of(batch)
        if n is not None:
            self._rundir.note(data={"batch_size": n})

    def on_unscaled(self) -> None:
        """After ``GradScaler.unscale_`` (also on steps the scaler then skips)."""
        self._guard("scaler", self._gradients_ready)
        self._guard("scaler", self.capture_scale)

    def gradients_ready(self) -> None:
        """Lifecycle 2: gradients are final for this optimizer step and the weights are not
        updated yet: read the gradient statistics that are due (and copy the weights at the
        update-ratio cadence). Idempotent within a step."""
        if self.closed or is_compiling():
            return
        self._guard("gradients_ready", self._before_update)

    def optimizer_stepped(self) -> None:
        """Lifecycle 3: the optimizer updated the weights (update ratios; a step whose
        :meth:`step_ended` came first is committed now)."""
        if self.closed or is_compiling():
            return
        self._guard("optimizer_stepped", self._after_update)

    @property
    def acc(self) -> StepAccum:  # the open step (collecting values now)
        return self._steps.open

    def _step_ended(self, loss: Any, step: int | None, lr: Any,
                    metrics: dict[str, Any], tokens: int | None = None) -> None:
        with self._lock:
            # the step's end and its host CPU figures, read together (cpuclock.py)
            now, cpu, queue = self._clock.lap()
            acc = self._steps.values_step()
            if step is not None:
                acc.step = int(step)
            bad = [] if acc.add_scalar("loss", loss) else [("loss", loss)]
            if lr is None and self.optimizer is not None:  # the one its update used
                lr = acc.lr_used if acc.lr_used is not None else lr_now(self.optimizer)
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
                    self.capture_scale(acc)
            acc.ended = now  # (a micro-batch folded in adds its time: one optimizer step)
            acc.duration_s = (acc.duration_s or 0.0) + (now - self._last_end)
            self._last_end = now
            acc.cpu_s = (acc.cpu_s or 0.0) + cpu
            acc.cpu_queue_s = None if queue is None else (acc.cpu_queue_s or 0.0) + queue
            if tokens is not None:
                acc.user_tokens = (acc.user_tokens or 0) + int(tokens)
            if self.flops is not None:  # (ends this step's count, may start the next's)
                acc.flops = self.flops.ended(acc.samples, self._tokens(acc))
            if self.structure is not None:
                self.structure, probe = None, self.structure
                probe.end_pass()
            # Complete when its gradients were read; without an optimizer they are read
            # here. With one that has not stepped yet (rec.step() before opt.step()), its
            # hooks attach the gradients (and update ratios), then the step commits.
            complete = acc.grads_captured or (self.optimizer is None and self.scaler is None)
            if complete and not acc.grads_captured:
                self._reader.capture(acc)
            nxt = self._steps.ended(acc, complete=complete)
            self.shapes.step_started()  # (its first forward's input shapes: shapes.py)
            if self.act is not None and self.config.activation_stats_every:
                self.act.next_step(nxt.step)
            if self.profiler is not None:
                self.profiler.after_step()
                self.profiler.before_step(nxt.step)
            if self.anomaly is not None:
                self.anomaly.step_ended()

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
        """An optimizer/scaler hook's step: the pending one (rec.step() came first), else open."""
        return self._steps.target()

    def _gradients_ready(self) -> None:
        with self._lock:
            target = self._hook_target()
            if not target.grads_captured:
                self._reader.capture(target)
                self._steps.gradients_read(target)

    def clip_sink(self, tensors: list[Any]) -> Any:
        """clip_grad_norm_ is about to norm ``tensors`` (see :mod:`.clipping`): if they are
        this model's gradients, still unread this step, a sink for their norms."""
        if self.closed:
            return None
        with self._lock:
            target = self._hook_target()
            if target.grads_captured or target.norms_read:
                return None
            return self._reader.clip_sink(target, tensors)

    def grad_landed(self, _param: Any) -> None:
        """A watched parameter's gradient was accumulated (distributed runs; see
        Recorder._watch_compute): host time only, no device work."""
        self.acc.grad_ready = time.perf_counter()

    def clip_max(self, max_norm: float) -> None:
        # clip_grad_norm_(..., inf) only measures (transformers does so every step when
        # max_grad_norm is 0): no clipping threshold to record.
        if not self.closed and max_norm < float("inf"):
            self._hook_target().floats["grad_clip"] = [max_norm]

    def _before_update(self) -> None:
        self._train_thread = threading.get_ident()  # the optimizer steps where training runs
        self._gradients_ready()
        target = self._hook_target()
        self._reader.guard_update(target)  # (zero_nonfinite_grads: after the norms were read)
        # Once a step: a framework may call gradients_ready() again after the update (the
        # transformers callback does), when a copy would be of the updated weights.
        if self.config.update_ratio_every and not target.snapshotted:
            target.snapshotted = True
            self._reader.snapshot_params(target.step)
        if self.optimizer is not None and target.lr_used is None:  # (the first call: the
            target.lr_used = lr_now(self.optimizer)  # LR this update uses; a scheduler next)

    def _after_update(self) -> None:
        if self._reader.snapshot is not None:
            self._guard("optimizer_hook", self._reader.update_ratio, self._hook_target())
        if self._steps.pending is None:
            return  # rec.step() comes after opt.step() (the usual order): it commits
        with self._lock:
            self._steps.optimizer_stepped()

    def capture_scale(self, acc: StepAccum | None = None) -> None:
        if self.amp is not None:
            self.amp.capture_scale(acc if acc is not None else self._hook_target())

    # The optimizer hooks run right after backward and right after the optimizer step, when
    # the interpreter's caches are cold: each Python call there costs several times what it
    # does in a loop. So each hook is one guarded call that checks what is due first.
    def on_opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if is_compiling():  # a compiled optimizer step: telemetry must not break the graph
            return
        try:
            self._before_update()
        except Exception as exc:
            self._count_error("optimizer_hook", exc)

    def on_opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if is_compiling():
            return
        try:
            self._after_update()
        except Exception as exc:
            self._count_error("optimizer_hook", exc)

    def drain(self) -> None:
        """Closing: commit the step still waiting for its optimizer step, stop profiling."""
        pending = self._steps.drain()
        if pending is not None:
            self.commit(pending)
        if self.profiler is not None:
            self.profiler.stop()
        for part in (self.flops, self.shapes):
            if part is not None:
                part.close()
        self._clock.close()

    @staticmethod
    def _tokens(acc: StepAccum) -> int | None:
        return acc.user_tokens if acc.user_tokens is not None else acc.tokens

    def commit(self, acc: StepAccum) -> None:
        if self.act is not None and not self.act.traced:
            why = self.act.untraced(acc)
            if why is not None:
                self.event("activation_tracing_unavailable", why, severity="info")
        join_pieces(acc)
        host, event = pack(acc)
        # The step's device pieces are copied (stream-ordered): drop them before the CUDA
        # counters are read, so the row holds the user's memory, not the recorder's too.
        acc.tensors, acc.probes, acc.act_stats = [], [], []
        memory = due(self.config.memory_every, acc.step)
        cuda = self._probe.cuda_at_commit() if memory else None
        item = StepItem(
            step=acc.step, time=acc.ended or time.time(), duration_s=acc.duration_s,
            data_wait_s=acc.data_wait_s if acc.waited else None,
            floats=acc.floats, metrics=acc.metrics, pieces=acc.pieces, host=host, event=event,
            scaler=acc.scaler, memory=memory, rss=self._probe.rss() if memory else None,
            heap=self._probe.heap_at_commit() if memory else None,
            recorder_heap=held_bytes(self._writer.buffers) if memory else None,
            cuda=cuda,
            store_grad_norms=self.config.store_grad_norms and self._grad_rows,
            compute_s=_compute_s(acc), sample_ids=acc.sample_ids, cpu_s=acc.cpu_s,
            cpu_queue_s=acc.cpu_queue_s,
            **step_rates(acc, self._tokens(acc), self.flops),
        )
        self.next_step = acc.step + 1
        self._rundir.step_committed()
        if self.tree is not None:
            self.tree.step_ended(acc.step)
        self._writer.submit(item, "steps")


def _compute_s(acc: StepAccum) -> float | None:
    """Distributed runs: the rank's own work before the all-reduce wait, from its batch's
    arrival (or, without a wrapped loader, the previous step's end) to its last watched
    gradient. None where no gradient hook fired (single-process runs)."""
    if acc.grad_ready is None:
        return None
    start = acc.data_ready if acc.data_ready is not None else acc.opened
    return acc.grad_ready - start if acc.grad_ready > start else None

