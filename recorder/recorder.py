"""The Recorder: the one object a training script uses.

Contract (DESIGN.md): cheap enough to leave on in production, never breaks or stalls
training, never loses what it has written. After construction every public method catches
its own failures, counts them, records them as ``recorder_error`` events where possible and
returns; only bad configuration at construction raises (``ValueError``).

It wires collaborators with one job each (CONTRIBUTING.md's map: ``write/``, ``tensors/``,
``training/``, ``live/``, :class:`~.lifecycle.StepLifecycle`) and owns closing."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tracealyze.format.hparams import MAX_KEYS, flatten
from tracealyze.format.parts import COMPACT_FANOUT
from tracealyze.format.spool import Spool

from .capture import event_row, exception_row
from .config import Preset, RecorderConfig, check_arguments, unwrap_optimizer
from .lifecycle import StepLifecycle
from .live.dist import rank_and_world, watch_compute
from .live.guard import Guard
from .live.interrupts import HeldInterrupts, say_gave_up
from .live.process_hooks import ProcessHooks
from .teardown import abandon, teardown_hooks
from .tensors import anomaly, clipping
from .tensors.activations import ActivationCapture
from .tensors.amp import ScalerHook
from .tensors.budget import NormBudget
from .tensors.gradients import GradReader
from .tensors.hooks import compiled, device_of, unwrap_model, wrapped_in_ddp
from .tensors.stats import FullStats
from .training.coverage import Coverage
from .training.heap import tune_for
from .training.loader import TimedLoader
from .training.model_tree import ModelWatch
from .training.oom import OomSnapshots
from .training.profiling import ProfilerSchedule
from .training.sampler import MemoryProbe, SystemSampler
from .training.structure import StructureProbe
from .training.throughput import FlopMeter
from .write.freedir import resolve
from .write.report_to import Reporter
from .write.rows import StepRows
from .write.rundir import RunDir
from .write.writer import Writer, merge_parts

_SEVERITIES = ("info", "warning", "error", "critical")


class Recorder:
    """Records per-step training telemetry into ``run_dir`` (see README for presets).

    >>> with Recorder("runs/exp1", model=model, optimizer=opt) as rec:   # doctest: +SKIP
    ...     for x, y in rec.wrap_loader(loader):
    ...         loss = loss_fn(model(x), y)
    ...         opt.zero_grad(); loss.backward(); opt.step()
    ...         rec.step(loss=loss)

    The step lifecycle (``data_wait_ended``, ``gradients_ready``, ``optimizer_stepped``,
    ``step_ended``) is documented in :mod:`.lifecycle`."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        preset: Preset = "standard",
        resume: bool = False,
        scaler: Any = None,
        hparams: Any = None,
        if_exists: str = "error",
        **overrides: Any,
    ) -> None:
        run_dir = resolve(run_dir, if_exists, resume)  # ("new": runs/exp1-2 beside exp1)
        self.config = RecorderConfig.from_preset(preset, **overrides)
        flat, cut = flatten(hparams) if hparams is not None else ({}, 0)  # (ValueError)
        self.preset = preset
        self._life: StepLifecycle | None = None  # made by _start: closed until then
        check_arguments(run_dir, model, optimizer, scaler, resume)
        self.run_dir = Path(run_dir)
        self.model = unwrap_model(model) if model is not None else None
        self._compiled_model = model is not None and compiled(model)
        self._ddp = model is not None and wrapped_in_ddp(model)
        # Hooks go on the torch optimizer in a framework's wrapper (accelerate, Lightning)
        self.optimizer = unwrap_optimizer(optimizer) if optimizer is not None else None
        self.scaler = scaler
        self.rank, self.world_size = rank_and_world()
        self.guard = Guard()  # shared with the writer: one count, one warn-once
        self._next_step = 0
        if not self.config.enabled:
            return

        self._lock = threading.RLock()
        self._named_params = (list(self.model.named_parameters())
                              if self.model is not None else [])
        self._device = device_of(self._named_params)
        self._spool = Spool.of(run_dir, self.config.spool_dir, resume)  # (None: local)
        self.run_dir = self._spool.path if self._spool is not None else self.run_dir
        self._report = Reporter.of(self.config.report_to, self.rank)  # (None: not asked)
        self._rundir = RunDir(
            self.run_dir, rank=self.rank, world_size=self.world_size, preset=preset,
            knobs=self.config.to_json(), flush_interval_s=self.config.flush_interval_s,
            resume=resume, model=self.model)
        self._next_step = self._rundir.next_step
        try:
            self._start(resume)
        except BaseException:
            # A start that failed half-way must not leave a run marked "running" that
            # refuses the retry: take back what was installed and, for a new run, the
            # metadata files this constructor wrote (no step was recorded yet).
            self._abandon(resume)
            raise
        self._add_hparams(None, flat, cut)

    def _start(self, resume: bool) -> None:
        self._full = FullStats(self.config.stats_chunk_elems)
        self._reader = GradReader(self._named_params, self.config, self._full,
                                  on_stride=self._norm_stride_changed)
        self._reader.on_hist_stride = lambda _s, b: self._info("histogram_cadence")(
            *b.cadence_event())
        self._reader.on_present = Coverage(self._named_params, lambda: self.optimizer,
                                           self._info("param_coverage")).seen
        # DDP: every rank holds the same gradients; rank 0 writes their per-parameter rows
        self._reader.grad_stats = self._grad_rows = (
            self.config.grad_stats_all_ranks or not self._ddp or self.rank == 0)
        self._probe = MemoryProbe(self._device, on_cost=self._info("recorder_cost"))
        self._oom = OomSnapshots(self.run_dir, self.rank, self._device, self.config.memory_history,
                                 self._info("memory_snapshot"), self.config.memory_history_at,
                                 self._probe)
        self._writer = Writer(
            self.run_dir, self.rank, flush_interval_s=self.config.flush_interval_s,
            flush_rows=self.config.flush_rows, queue_size=self.config.queue_size,
            max_buffered_rows=self.config.max_buffered_rows,
            max_buffered_bytes=self.config.max_buffered_bytes, on_flush=self._heartbeat,
            compact_fanout=COMPACT_FANOUT if self.config.merge_on_close else 0,
            guard=self.guard, steps=StepRows(self._probe))
        self._life = StepLifecycle(
            config=self.config, first_step=self._next_step, optimizer=self.optimizer,
            scaler=self.scaler, reader=self._reader, writer=self._writer, probe=self._probe,
            rundir=self._rundir, guard=self.guard, call=self._guard,
            count_error=self._count_error, event=self.event, lock=self._lock,
            grad_rows=self._grad_rows)
        self._status = "running"
        self._handles: list[Any] = []
        self._install_hooks()
        self._sampler = None
        if self.config.system_interval_s > 0:
            self._sampler = SystemSampler(
                self.config.system_interval_s, self._emit_system,
                gpu=self._device is not None and self._device.type == "cuda")
            self._sampler.start()
        self._life.profiler = ProfilerSchedule.of(
            self.config, self.run_dir / "traces" / f"rank={self.rank}",
            cuda=self._device is not None and self._device.type == "cuda",
            submit=lambda item: self._writer.submit(item, "traces", wake=True),
            on_window=lambda a, b: self.event(
                "profiler_window", f"profiler window over steps {a}-{b}", severity="info",
                first_step=a, last_step=b))
        tune_for(self._device, self.config.tune_malloc, self.event)  # (CPU, glibc: heap.py)
        self._life.anomaly = anomaly.start(self)  # (anomaly.py)
        if self._spool is not None:  # object storage: uploads of what the writer flushed
            self._spool.start(self._store_event, self.config, self.rank, self._writer)
        self._process = ProcessHooks(self, handle_sigterm=self.config.handle_sigterm)
        if self._rundir.resumed_from is not None:
            self.event("resumed", f"run resumed at step {self._next_step}", severity="info",
                       from_step=self._rundir.resumed_from)

    def _abandon(self, resume: bool) -> None:
        abandon(self, resume)

    # ------------------------------------------------------------------ construction
    def _install_hooks(self) -> None:
        life, cfg = self._life, self.config
        assert life is not None
        opt = self.optimizer
        if opt is not None:
            self._handles.append(opt.register_step_pre_hook(life.on_opt_pre))
            self._handles.append(opt.register_step_post_hook(life.on_opt_post))
        if self.scaler is not None:
            life.amp = ScalerHook(self.scaler, life.on_unscaled)
        if self._named_params:
            clipping.install(id(self), life.clip_sink, life.clip_max)
        if self.world_size > 1:
            self._handles += watch_compute(self._named_params, life.grad_landed)
        if self.model is not None:  # (its tree now, and again if it changes size)
            life.tree = ModelWatch(self.model, lambda: self.optimizer, self._info("model_tree"))
        if self.model is not None and not self._compiled_model:  # (one forward pass)
            probe = life.structure = StructureProbe(self.model, self._info("model_structure"))
            self._handles.append(probe)
            life.flops = FlopMeter(self.model, cfg.peak_flops, self._info("flops_counted"))
            life.shapes.watch_forward(self.model, lambda: life.acc)
        if self.model is not None and (cfg.activation_nonfinite or cfg.activation_stats_every):
            life.act = ActivationCapture(self.model, cfg, self._full, lambda: life.acc,
                                         self._guard, compiled=self._compiled_model)
            life.act.next_step(life.acc.step)

    def _info(self, kind: str) -> Any:  # (message, details) -> an info event of ``kind``
        return lambda message, details: self.event(kind, message, severity="info", **details)

    def _norm_stride_changed(self, stride: int, budget: NormBudget) -> None:
        self._info("grad_norm_cadence")(*budget.cadence_event())

    # ------------------------------------------------------------------ public API
    def event(self, kind: str, message: str, *, severity: str = "warning",
              subject: str | None = None, stack: str | None = None, **details: Any) -> None:
        """Record a user event (e.g. ``rec.event("checkpoint", "saved", severity="info")``)."""
        if self._closed:
            return
        self._guard("event", self._event, kind, message, severity, subject, stack, details)

    def _event(self, kind: Any, message: Any, severity: str, subject: Any, stack: Any,
               details: dict[str, Any]) -> None:
        if severity not in _SEVERITIES:
            severity = "warning"
        row = event_row(self._life.acc.step, kind, message,
                        severity=severity, subject=subject, stack=stack, details=details)
        self._writer.submit(lambda w: w.append("events", row), "events")

    def _store_event(self, kind: str, message: str, severity: str = "warning",
                     **details: Any) -> None:
        """The uploader's events, taken even while closing (rec.event takes none then)."""
        self._guard("event", self._event, kind, message, severity, None, None, details)

    def log_hparams(self, hparams: Any) -> None:
        """Add hyperparameters known only now (``{"data.tokens": n}``, a config object):
        flattened with dots into run.json's ``hparams``, a key given again taking the new
        value (format/hparams.py says how objects, sizes and odd values are kept)."""
        if not self._closed:
            self._guard("hparams", self._add_hparams, hparams)

    def _add_hparams(self, hparams: Any, flat: Any = None, cut: int = 0) -> None:
        if flat is None:
            flat, cut = flatten(hparams)
        cut += self._rundir.add_hparams(flat)
        if cut:
            self.event("hparams_truncated", f"{cut} hyperparameter key(s) left out: a run "
                       f"keeps {MAX_KEYS}", severity="info", dropped=cut)

    def watch(self, name: str, tensor: torch.Tensor) -> None:
        """Statistics of any tensor at the current step (kind ``watch``)."""
        if self._closed:
            return
        self._guard("watch", self._life.watch, name, tensor)

    def wrap_loader(self, loader: Iterable[Any]) -> Iterable[Any]:
        """The same iterable, timing how long each step waits for its next batch."""
        return TimedLoader(loader, self.data_wait_ended, self.config.record_sample_ids)

    def close(self, status: str | None = None) -> None:
        """Flush everything, merge parts and mark the run completed (idempotent). A Ctrl-C
        during the save is held and delivered once it is done (interrupts.HeldInterrupts)."""
        self._shutdown(status, deliver=True)

    def _shutdown(self, status: str | None, *, deliver: bool) -> None:
        """close(); ``deliver=False`` from the process hooks (excepthook, atexit, SIGTERM),
        where the process is ending and a held Ctrl-C must not raise."""
        if getattr(self, "_closed", True):
            return
        with HeldInterrupts() as held, self._lock:
            if self._closed:
                return
            self._life.closed = True
            final = status or ("crashed" if self._status == "crashed" else "completed")
            self._status = final
            try:
                self._life.drain()
            except Exception as exc:
                self._count_error("close", exc)
            self._teardown_hooks()
            if self._sampler is not None:
                self._sampler.stop()
            if self._spool is not None:  # the uploader's last event before the last flush
                self._guard("upload", self._spool.settle, self.config.upload_timeout_s)
            if not self._writer.close(give_up=lambda: held.expired):
                say_gave_up(held.grace_s)
            elif self.config.merge_on_close and not held.expired:
                try:
                    merge_parts(self.run_dir, self.rank)
                except Exception as exc:
                    self._count_error("merge", exc)
            try:
                self._rundir.write(self._counters(), status=final)
            except Exception as exc:
                self._count_error("run.json", exc)
            self._rundir.lock.release()
            if self._spool is not None:  # the last upload (the spool is kept if it fails)
                self._spool.close(self.config.upload_timeout_s)
        if deliver and self._report is not None:  # (outside the lock: it takes seconds)
            self._report.close(self._spool.url if self._spool else str(self.run_dir))
        if deliver:
            held.deliver(unless_exiting=True)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is not None and not self._closed:
            self._record_exception(exc)
        self.close(status="crashed" if exc is not None else None)
        return False  # never swallow the user's exception

    @property
    def current_step(self) -> int:
        """The number the next recorded step will get."""
        life = self._life
        if life is None:
            return self._next_step
        return life.next_step if life.closed else life.acc.step

    # ------------------------------------- step lifecycle (forwarded; no-op when disabled)
    def step(self, loss: Any = None, *, step: int | None = None, lr: Any = None,
             tokens: int | None = None, **metrics: Any) -> None:
        """End one recorded step (lifecycle 4). Values may be Python numbers or tensors on
        any device; tensors are read later, without a host-device sync. ``lr`` defaults to
        the optimizer's first param group; ``tokens``: the step's real token count (else
        the batches' token positions). From a thread other than the training thread, the
        values join the open step as metrics."""
        if self._life is not None:
            self._life.step(loss, step=step, lr=lr, tokens=tokens, **metrics)

    def step_ended(self, loss: Any = None, **kw: Any) -> None:
        self.step(loss, **kw)  # lifecycle 4: the step is over (the same as step())

    def data_wait_ended(self, seconds: float, batch: Any = None, sample_ids: Any = None) -> None:
        """Lifecycle 1: the open step waited ``seconds`` for its data (summed over micro-
        batches: ``data_wait_s``). ``batch``: the batch that arrived (the first one's leading
        dimension is run.json's ``data.batch_size``, so ``compare`` tells batch sizes apart)."""
        if self._life is not None:
            self._life.data_wait_ended(seconds, batch, sample_ids)

    def gradients_ready(self) -> None:
        """Lifecycle 2: gradients are final, the weights not yet updated: read the gradient
        statistics due (and copy weights at the update-ratio cadence). Idempotent."""
        if self._life is not None:
            self._life.gradients_ready()

    def optimizer_stepped(self) -> None:
        """Lifecycle 3: the weights were updated (update ratios; a step whose
        :meth:`step_ended` came first is committed now)."""
        if self._life is not None:
            self._life.optimizer_stepped()

    @property
    def _closed(self) -> bool:
        return self._life is None or self._life.closed

    @property
    def errors(self) -> int:
        """Recorder failures so far (training and writer threads); training went on."""
        return self.guard.errors

    def _guard(self, where: str, fn: Any, *args: Any) -> Any:
        return self.guard.call(where, fn, *args, record=self._error_event)

    def _count_error(self, where: str, exc: BaseException) -> None:
        self.guard.failed(where, exc)
        self._error_event(where, exc)

    def _error_event(self, where: str, exc: BaseException) -> None:
        writer = getattr(self, "_writer", None)
        if writer is not None and writer.alive:  # (counted already: the event only)
            writer.submit(lambda w: w.error_event(where, exc), "events")

    def _emit_system(self, row: dict[str, Any]) -> None:
        self._writer.submit(lambda w: w.append("system", {k: [v] for k, v in row.items()}),
                            "system")

    def _record_exception(self, exc: BaseException) -> None:
        try:
            row = exception_row(exc, self._life.acc.step, self._probe)
            self._writer.submit(lambda w: w.append("events", row), "events")
            self._status = "crashed"
            self._oom.at_exception(exc, self._life.acc.step)  # (a CUDA OOM: oom.py)
        except Exception as e:  # recording the crash must not mask it
            self._count_error("exception", e)

    def _teardown_hooks(self) -> None:
        teardown_hooks(self)

    def _counters(self) -> dict[str, Any]:
        # (the writer's first flush can come before its constructor returned to us)
        w = getattr(self, "_writer", None)
        return {"dropped": dict(w.dropped) if w is not None else {},
                "recorder_errors": self.guard.errors}

    def _heartbeat(self) -> None:
        """Called by the writer after each successful flush (writer thread)."""
        self._rundir.write(self._counters())
        if self._spool is not None:
            self._spool.wake()
