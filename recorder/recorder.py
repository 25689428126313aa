"""The Recorder: the one object a training script uses.

Contract (DESIGN.md): cheap enough to leave on in production, never breaks or stalls
training, never loses what it has written. After construction every public method catches
its own failures, counts them, records them as ``recorder_error`` events where possible and
returns; only bad configuration at construction raises (``ValueError``).

The Recorder ties together collaborators with one job each: :class:`~.rundir.RunDir` (run.json,
resume), :class:`~.writer.Writer` (background Parquet writes), :class:`~.gradients.GradReader`
(gradient and weight statistics), :class:`~.activations.ActivationCapture` (module outputs),
:class:`~.process_hooks.ProcessHooks` (atexit, SIGTERM, excepthook), the sampler and the
profiler schedule. What it owns itself is the step lifecycle below.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tracealyze.format.parts import COMPACT_FANOUT

from . import clipping
from .activations import ActivationCapture
from .amp import ScalerHook
from .budget import NormBudget
from .capture import Piece, event_row, exception_row, watchable
from .config import Preset, RecorderConfig, check_arguments, unwrap_optimizer
from .coverage import Coverage
from .dist import rank_and_world, watch_compute
from .gradients import GradReader
from .guard import Guard
from .hooks import compiled, unwrap_model, wrapped_in_ddp
from .interrupts import HeldInterrupts, say_gave_up
from .lifecycle import StepLifecycle
from .loader import TimedLoader, batch_size_of
from .process_hooks import ProcessHooks
from .profiling import ProfilerSchedule
from .rows import StepRows
from .rundir import RunDir
from .sampler import MemoryProbe, SystemSampler
from .stats import FullStats
from .stepstate import StepMachine
from .structure import StructureProbe
from .writer import Writer, merge_parts

_SEVERITIES = ("info", "warning", "error", "critical")


class Recorder(StepLifecycle):
    """Records per-step training telemetry into ``run_dir`` (see README for presets).

    >>> with Recorder("runs/exp1", model=model, optimizer=opt) as rec:   # doctest: +SKIP
    ...     for x, y in rec.wrap_loader(loader):
    ...         loss = loss_fn(model(x), y)
    ...         opt.zero_grad(); loss.backward(); opt.step()
    ...         rec.step(loss=loss)

    The step lifecycle (:class:`~.lifecycle.StepLifecycle`) is documented there.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        preset: Preset = "standard",
        resume: bool = False,
        scaler: Any = None,
        **overrides: Any,
    ) -> None:
        self.config = RecorderConfig.from_preset(preset, **overrides)
        self.preset = preset
        self._closed = True  # until construction succeeds
        check_arguments(run_dir, model, optimizer, scaler, resume)
        self.run_dir = Path(run_dir)
        self.model = unwrap_model(model) if model is not None else None
        self._compiled_model = model is not None and compiled(model)
        self._ddp = model is not None and wrapped_in_ddp(model)
        # The hooks go on the torch optimizer inside a framework's wrapper (accelerate,
        # Lightning), which every wrapper steps.
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
        self._device = self._pick_device()
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

    def _start(self, resume: bool) -> None:
        self._full = FullStats(self.config.stats_chunk_elems)
        self._reader = GradReader(self._named_params, self.config, self._full,
                                  on_stride=self._norm_stride_changed)
        self._reader.on_present = Coverage(self._named_params, lambda: self.optimizer,
                                           self._info("param_coverage")).seen
        # DDP: every rank holds the same gradients; rank 0 writes their per-parameter rows
        self._grad_rows = (self.config.grad_stats_all_ranks or not self._ddp
                           or self.rank == 0)
        self._reader.grad_stats = self._grad_rows
        self._probe = MemoryProbe(self._device)
        self._writer = Writer(
            self.run_dir, self.rank, flush_interval_s=self.config.flush_interval_s,
            flush_rows=self.config.flush_rows, queue_size=self.config.queue_size,
            max_buffered_rows=self.config.max_buffered_rows,
            max_buffered_bytes=self.config.max_buffered_bytes, on_flush=self._heartbeat,
            compact_fanout=COMPACT_FANOUT if self.config.merge_on_close else 0,
            guard=self.guard, steps=StepRows(self._probe))
        self._steps = StepMachine(self._next_step, self._reader.signature, self._commit)
        self._last_end = time.time()
        self._closed = False
        self._batch_noted = False
        # with an optimizer: this thread until its pre-hook says where training runs
        self._train_thread: int | None = (threading.get_ident() if self.optimizer is not None
                                          else None)
        self._side_noted = False
        self._status = "running"
        self._handles: list[Any] = []
        self._act: ActivationCapture | None = None
        self._install_hooks()
        self._sampler = None
        if self.config.system_interval_s > 0:
            self._sampler = SystemSampler(
                self.config.system_interval_s, self._emit_system,
                gpu=self._device is not None and self._device.type == "cuda")
            self._sampler.start()
        self._profiler = None
        if self.config.profile_start > 0 or self.config.profile_every > 0:
            if self.config.profile_quiet:
                # Read once, when Kineto first starts: before the first window. Level 6 is
                # above USDT (5), which is above ERROR (4): no finer setting exists.
                os.environ.setdefault("KINETO_LOG_LEVEL", "6")
            self._profiler = ProfilerSchedule(
                start=self.config.profile_start, every=self.config.profile_every,
                warmup=self.config.profile_warmup, active=self.config.profile_active,
                max_windows=self.config.profile_max_windows,
                trace_dir=self.run_dir / "traces" / f"rank={self.rank}",
                cuda=self._device is not None and self._device.type == "cuda",
                submit=lambda item: self._writer.submit(item, "traces", wake=True),
                on_window=lambda a, b: self.event(
                    "profiler_window", f"profiler window over steps {a}-{b}", severity="info",
                    first_step=a, last_step=b))
        if self.config.anomaly_mode:
            torch.autograd.set_detect_anomaly(True)
        self._process = ProcessHooks(self, handle_sigterm=self.config.handle_sigterm)
        if self._rundir.resumed_from is not None:
            self.event("resumed", f"run resumed at step {self._next_step}", severity="info",
                       from_step=self._rundir.resumed_from)

    def _abandon(self, resume: bool) -> None:
        self._closed = True
        try:
            self._teardown_hooks()
        except Exception:
            pass
        sampler, writer = getattr(self, "_sampler", None), getattr(self, "_writer", None)
        try:
            if sampler is not None:
                sampler.stop()
            if writer is not None:
                writer.close()
            if resume:
                self._rundir.write(self._counters(), status="crashed")
                self._rundir.lock.release()
            else:
                self._rundir.discard()
        except Exception:
            pass

    # ------------------------------------------------------------------ construction
    def _pick_device(self) -> torch.device | None:
        for _, p in self._named_params:
            return p.device
        return torch.device("cuda") if torch.cuda.is_available() else None

    def _install_hooks(self) -> None:
        opt = self.optimizer
        if opt is not None:
            self._handles.append(opt.register_step_pre_hook(self._on_opt_pre))
            self._handles.append(opt.register_step_post_hook(self._on_opt_post))
        self._amp = ScalerHook(self.scaler, self._on_unscaled) if self.scaler is not None \
            else None
        if self._named_params:
            clipping.install(id(self), self._clip_sink, self._clip_max)
        if self.world_size > 1:
            self._handles += watch_compute(self._named_params, self._grad_landed)
        if self.model is not None and not self._compiled_model:  # (one forward pass)
            self._handles.append(StructureProbe(self.model, self._info("model_structure")))
        cfg = self.config
        if self.model is not None and (cfg.activation_nonfinite or cfg.activation_stats_every):
            self._act = ActivationCapture(self.model, cfg, self._full, lambda: self._acc,
                                          self._guard, compiled=self._compiled_model)
            self._act.next_step(self._acc.step)

    def _on_unscaled(self) -> None:
        """After ``GradScaler.unscale_`` (also on steps the scaler then skips)."""
        self._guard("scaler", self._gradients_ready)
        self._guard("scaler", self._capture_scale)

    def _info(self, kind: str) -> Any:
        """(message, details) -> an info event of ``kind``."""
        return lambda message, details: self.event(kind, message, severity="info", **details)

    def _norm_stride_changed(self, stride: int, budget: NormBudget) -> None:
        # (a stride changes only once both medians exist)
        cost, period = budget.cost_s or 0.0, budget.period_s or 1.0
        every = self.config.grad_norm_every * stride
        self.event(
            "grad_norm_cadence",
            f"reading the gradient norms took {cost / period:.1%} of the step "
            f"({cost * 1e3:.2f} ms of {period * 1e3:.1f} ms; "
            f"budget {budget.budget:.1%}): now every {every} step{'s' if every > 1 else ''}",
            severity="info", every=every, cost_s=budget.cost_s, step_s=budget.period_s)

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
        row = event_row(self._acc.step if self._acc else None, kind, message,
                        severity=severity, subject=subject, stack=stack, details=details)
        self._writer.submit(lambda w: w.append("events", row), "events")

    def watch(self, name: str, tensor: torch.Tensor) -> None:
        """Statistics of any tensor at the current step (kind ``watch``)."""
        if self._closed:
            return
        self._guard("watch", self._watch, name, tensor)

    def wrap_loader(self, loader: Iterable[Any]) -> Iterable[Any]:
        """The same iterable, timing how long each step waits for its next batch."""
        return TimedLoader(loader, self.data_wait_ended)

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
            self._closed = True
            final = status or ("crashed" if self._status == "crashed" else "completed")
            self._status = final
            try:
                pending = self._steps.drain()
                if pending is not None:
                    self._commit(pending)
                if self._profiler is not None:
                    self._profiler.stop()
            except Exception as exc:
                self._count_error("close", exc)
            self._teardown_hooks()
            if self._sampler is not None:
                self._sampler.stop()
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
        if deliver:
            held.deliver(unless_exiting=True)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is not None and not self._closed:
            self._record_exception(exc)
            self.close(status="crashed")
        else:
            self.close()
        return False  # never swallow the user's exception

    @property
    def current_step(self) -> int:
        """The number the next recorded step will get."""
        return self._acc.step if not self._closed else self._next_step

    # ------------------------------------------------------------------ internals
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

    def _watch(self, name: str, tensor: torch.Tensor) -> None:
        tensor = watchable(str(name), tensor)  # ValueError: only this watch is left out
        stats = self._full.one(tensor)
        with self._lock:  # another thread may be ending the step (its accumulator swapped)
            self._acc.add(Piece("watch", 8, (str(name),), (tensor.numel(),)), stats)

    def _emit_system(self, row: dict[str, Any]) -> None:
        self._writer.submit(lambda w: w.append("system", {k: [v] for k, v in row.items()}),
                            "system")

    def _record_exception(self, exc: BaseException) -> None:
        try:
            row = exception_row(exc, self._acc.step, self._probe)
            self._writer.submit(lambda w: w.append("events", row), "events")
            self._status = "crashed"
        except Exception as e:  # recording the crash must not mask it
            self._count_error("exception", e)

    def _teardown_hooks(self) -> None:
        # (also after a start that failed half-way: any of these may not exist yet)
        for h in getattr(self, "_handles", ()):
            try:
                h.remove()
            except Exception:
                pass
        self._handles = []
        clipping.uninstall(id(self))
        for part in (getattr(self, "_act", None), getattr(self, "_amp", None),
                     getattr(self, "_process", None)):
            if part is not None:
                part.remove()
        if self.config.anomaly_mode:
            torch.autograd.set_detect_anomaly(False)

    def _note_batch(self, batch: Any) -> None:
        """run.json's (and this rank's file's) ``data.batch_size``: written with the next
        heartbeat. A shape read only: no device sync, nothing copied."""
        n = batch_size_of(batch)
        if n is not None:
            self._rundir.note(data={"batch_size": n})

    def _counters(self) -> dict[str, Any]:
        # (the writer's first flush can come before its constructor returned to us)
        w = getattr(self, "_writer", None)
        return {"dropped": dict(w.dropped) if w is not None else {},
                "recorder_errors": self.guard.errors}

    def _heartbeat(self) -> None:
        """Called by the writer after each successful flush (writer thread)."""
        self._rundir.write(self._counters())
