"""The Recorder: the one object a training script uses.

Contract (DESIGN.md): cheap enough to leave on in production, never breaks or stalls
training, never loses what it has written. After construction every public method catches
its own failures, counts them, records them as ``recorder_error`` events where possible and
returns; only bad configuration at construction raises (``ValueError``).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Iterable, Iterator
from itertools import compress
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tracealyze.format.parts import COMPACT_FANOUT, remove_stale_tmp

from . import stats
from .capture import Piece, StepAccum, StepItem, event_row, pack
from .config import RecorderConfig
from .dist import rank_and_world
from .hooks import ActivationHooks, is_compiling, nonfinite_probes, unwrap_model
from .profiling import ProfilerSchedule
from .runmeta import new_run_meta, rank_meta, read_json, write_json_atomic
from .sampler import MemoryProbe, SystemSampler
from .schema import SCHEMA_VERSION
from .stats import FullStats, NormPlan, norms
from .writer import Writer, merge_parts

_SEVERITIES = ("info", "warning", "error", "critical")
# Module outputs recorded per step at most (a few forward passes of a large model).
_MAX_ACT_PIECES = 20_000


class Recorder:
    """Records per-step training telemetry into ``run_dir`` (see README for presets).

    >>> with Recorder("runs/exp1", model=model, optimizer=opt) as rec:   # doctest: +SKIP
    ...     for x, y in rec.wrap_loader(loader):
    ...         loss = loss_fn(model(x), y)
    ...         opt.zero_grad(); loss.backward(); opt.step()
    ...         rec.step(loss=loss)
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        preset: str = "standard",
        resume: bool = False,
        scaler: Any = None,
        **overrides: Any,
    ) -> None:
        self.config = RecorderConfig.from_preset(preset, **overrides)
        self.preset = preset
        self._closed = True  # until construction succeeds
        if not isinstance(run_dir, (str, os.PathLike)) or str(run_dir) == "":
            raise ValueError(f"run_dir must be a path, got {run_dir!r}")
        if model is not None and not isinstance(model, nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(
                f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if scaler is not None and not hasattr(scaler, "unscale_"):
            raise ValueError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
        if not isinstance(resume, bool):
            raise ValueError(f"resume must be True or False, got {resume!r}")
        self.run_dir = Path(run_dir)
        self.model = unwrap_model(model) if model is not None else None
        self.optimizer = optimizer
        self.scaler = scaler
        self.rank, self.world_size = rank_and_world()
        self.errors = 0
        self._error_kinds: set[str] = set()
        self._next_step = 0
        if not self.config.enabled:
            return

        self._lock = threading.RLock()
        self._prepare_run_dir(resume)
        self._named_params = (list(self.model.named_parameters())
                              if self.model is not None else [])
        self._params = [p for _, p in self._named_params]
        self._grad_layout: _GradLayout | None = None
        self._device = self._pick_device()
        self._full = FullStats(self.config.stats_chunk_elems)
        self._probe = MemoryProbe(self._device)
        self._nonfinite_state: dict[str, Any] = {}
        self._writer = Writer(
            self.run_dir, self.rank, flush_interval_s=self.config.flush_interval_s,
            flush_rows=self.config.flush_rows, queue_size=self.config.queue_size,
            max_buffered_rows=self.config.max_buffered_rows,
            max_buffered_bytes=self.config.max_buffered_bytes, on_flush=self._heartbeat,
            compact_fanout=COMPACT_FANOUT if self.config.merge_on_close else 0,
        )
        self._acc = StepAccum(step=self._next_step)
        self._pending: StepAccum | None = None
        self._pending_sig: tuple[int, int] | None = None
        self._last_end = time.time()
        self._closed = False
        self._status = "running"
        self._handles: list[Any] = []
        self._update_snapshot: list[torch.Tensor] | None = None
        self._act: ActivationHooks | None = None
        self._install_hooks()
        self._sampler = None
        if self.config.system_interval_s > 0:
            self._sampler = SystemSampler(
                self.config.system_interval_s, self._emit_system,
                gpu=self._device is not None and self._device.type == "cuda")
            self._sampler.start()
        self._profiler = None
        if self.config.profile_start > 0 or self.config.profile_every > 0:
            self._profiler = ProfilerSchedule(
                start=self.config.profile_start, every=self.config.profile_every,
                warmup=self.config.profile_warmup, active=self.config.profile_active,
                max_windows=self.config.profile_max_windows,
                trace_dir=self.run_dir / "traces" / f"rank={self.rank}",
                cuda=self._device is not None and self._device.type == "cuda",
                submit=lambda item: self._writer.submit(item, "traces", wake=True))
        if self.config.anomaly_mode:
            torch.autograd.set_detect_anomaly(True)
        self._install_process_hooks()
        if self._resumed_from is not None:
            self.event("resumed", f"run resumed at step {self._next_step}", severity="info",
                       from_step=self._resumed_from)

    # ------------------------------------------------------------------ construction
    def _prepare_run_dir(self, resume: bool) -> None:
        d = self.run_dir
        if d.exists() and not d.is_dir():
            raise ValueError(f"run_dir {str(d)!r} exists and is not a directory")
        run_json = d / "run.json"
        mine = run_json if self.rank == 0 else d / "ranks" / f"rank={self.rank}.json"
        existing = read_json(run_json) if run_json.exists() else None
        if run_json.exists() and existing is None and self.rank == 0:
            raise ValueError(f"{run_json} exists but is not readable JSON; refusing to "
                             "overwrite it (move it away or choose another run_dir)")
        if mine.exists() and not resume:
            status = (existing or {}).get("status", "?")
            raise ValueError(
                f"run_dir {str(d)!r} already holds a run (run_id "
                f"{(existing or {}).get('run_id', '?')}, status {status}); pass resume=True "
                "to append to it (e.g. after preemption) or choose a new directory")
        try:
            d.mkdir(parents=True, exist_ok=True)
            probe = d / f".tracealyze-write-test.{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise ValueError(f"cannot write to run_dir {str(d)!r}: {exc.strerror or exc}") \
                from exc
        self._resumed_from = None
        self._next_step = 0
        if resume and mine.exists():
            last = _last_step(d, self.rank)
            self._next_step = 0 if last is None else last + 1
            self._resumed_from = self._next_step
            remove_stale_tmp(d, self.rank)
        knobs = self.config.to_json()
        meta = existing if (existing and resume) else new_run_meta(
            preset=self.preset, knobs=knobs, world_size=self.world_size,
            model=self._model_summary(), device=self._device_summary(),
            flush_interval_s=self.config.flush_interval_s)
        if resume and existing:
            meta.setdefault("resumes", []).append(
                {"time": time.time(), "from_step": self._next_step, "rank": self.rank})
            meta["status"], meta["ended"] = "running", None
            meta["schema_version"] = SCHEMA_VERSION  # new parts are written in this format
            meta["knobs"], meta["preset"] = knobs, self.preset
        self._meta = meta
        self._rank_meta = rank_meta(self.rank, meta)
        # The run's id is rank 0's: another rank takes it from run.json, or, if it started
        # before rank 0 wrote that, at its next heartbeat (_adopt_run_id).
        self._rank_meta["run_id"] = (meta if self.rank == 0 else existing or {}).get("run_id")
        try:
            if self.rank == 0:
                write_json_atomic(run_json, meta)
            write_json_atomic(d / "ranks" / f"rank={self.rank}.json", self._rank_meta)
        except OSError as exc:
            raise ValueError(f"cannot write run metadata in {str(d)!r}: {exc}") from exc

    def _pick_device(self) -> torch.device | None:
        for _, p in self._named_params:
            return p.device
        return torch.device("cuda") if torch.cuda.is_available() else None

    def _model_summary(self) -> dict[str, Any] | None:
        if self.model is None:
            return None
        params = list(self.model.parameters())
        return {
            "class": type(self.model).__name__,
            "parameters": sum(p.numel() for p in params),
            "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
            "tensors": len(params),
            "modules": sum(1 for _ in self.model.modules()),
            "dtypes": sorted({str(p.dtype).replace("torch.", "") for p in params}),
            "devices": sorted({str(p.device) for p in params}),
        }

    def _device_summary(self) -> dict[str, Any] | None:
        dev = None
        if self.model is not None:
            dev = next((p.device for p in self.model.parameters()), None)
        if dev is None or dev.type != "cuda":
            return {"type": dev.type if dev is not None else "cpu"}
        try:
            props = torch.cuda.get_device_properties(dev)
            return {"type": "cuda", "name": props.name, "total_memory_bytes": props.total_memory,
                    "count": torch.cuda.device_count()}
        except Exception:
            return {"type": "cuda"}

    def _install_hooks(self) -> None:
        opt = self.optimizer
        if opt is not None:
            self._handles.append(opt.register_step_pre_hook(self._on_opt_pre))
            self._handles.append(opt.register_step_post_hook(self._on_opt_post))
        if self.scaler is not None:
            self._wrap_scaler()
        cfg = self.config
        if self.model is not None and (cfg.activation_nonfinite or cfg.activation_stats_every):
            self._act = ActivationHooks(self.model, self._on_activation, self._on_input,
                                        probe=cfg.activation_nonfinite,
                                        on_end=self._on_forward_end)
            self._act.hook_all(self._due(cfg.activation_stats_every, self._acc.step))

    def _wrap_scaler(self) -> None:
        # A step the scaler skips never calls optimizer.step(), so the pre-hook would miss
        # exactly the gradients that overflowed. unscale_ runs on every scaler.step (skipped
        # or not) right after the gradients are unscaled: read them there.
        scaler = self.scaler
        original = scaler.unscale_
        ref = weakref.ref(self)

        def unscale_(optimizer: torch.optim.Optimizer) -> Any:
            out = original(optimizer)
            rec = ref()
            if rec is not None:
                rec._guard("scaler", rec._capture_from_hook)
                rec._guard("scaler", rec._capture_scale)
            return out

        scaler.unscale_ = unscale_
        self._scaler_original = original

    def _install_process_hooks(self) -> None:
        self._atexit = lambda: self.close()
        atexit.register(self._atexit)
        self._prev_excepthook = sys.excepthook
        ref = weakref.ref(self)
        if hasattr(os, "register_at_fork"):
            # A forked child (DataLoader worker, ...) inherits this object, its SIGTERM
            # handler and excepthook, but not the writer thread, and the run is the
            # parent's: make the child's copy inert so it never writes or closes the run.
            os.register_at_fork(after_in_child=lambda: _inert_after_fork(ref))
        prev_hook = sys.excepthook

        def excepthook(tp: Any, val: Any, tb: Any) -> None:
            rec = ref()
            if rec is not None and not rec._closed:
                rec._record_exception(val)
                rec.close(status="crashed")
            prev_hook(tp, val, tb)

        sys.excepthook = excepthook
        self._excepthook = excepthook
        self._prev_sigterm = None
        if (self.config.handle_sigterm
                and threading.current_thread() is threading.main_thread()):
            try:
                self._prev_sigterm = signal.getsignal(signal.SIGTERM)
                signal.signal(signal.SIGTERM, self._on_sigterm)
            except (ValueError, OSError):
                self._prev_sigterm = None
        self._prev_showwarning = warnings.showwarning
        prev_show = warnings.showwarning

        def showwarning(message: Any, category: Any, filename: str, lineno: int,
                        file: Any = None, line: Any = None) -> None:
            rec = ref()
            text = str(message)
            if rec is not None and not rec._closed and "Error detected in" in text:
                # autograd.detect_anomaly's forward traceback of the op that produced NaN.
                subject = text.split("Error detected in", 1)[1].split(".")[0].strip()
                rec.event("anomaly", text.splitlines()[0], severity="error",
                          subject=subject, stack=text)
            prev_show(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning
        self._showwarning = showwarning

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.event("signal", "received SIGTERM; closing the run", severity="warning",
                   subject="SIGTERM")
        self.close(status="crashed")
        prev = self._prev_sigterm
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_IGN:
            return
        else:  # default action: terminate as if we had not been here
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    # ------------------------------------------------------------------ public API
    def step(self, loss: Any = None, *, step: int | None = None, lr: Any = None,
             **metrics: Any) -> None:
        """End one recorded step. Values may be Python numbers or tensors on any device;
        tensors are read later, without a host-device sync."""
        if self._closed or is_compiling():
            return
        self._guard("step", self._step, loss, step, lr, metrics)

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
        return _TimedLoader(loader, self)

    def close(self, status: str | None = None) -> None:
        """Flush everything, merge parts and mark the run completed (idempotent)."""
        if getattr(self, "_closed", True):
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            final = status or ("crashed" if self._status == "crashed" else "completed")
            self._status = final
            try:
                if self._pending is not None:
                    self._commit(self._pending)
                    self._pending = None
                if self._profiler is not None:
                    self._profiler.stop()
            except Exception as exc:
                self._count_error("close", exc)
            self._teardown_hooks()
            if self._sampler is not None:
                self._sampler.stop()
            self._writer.close()
            if self.config.merge_on_close:
                try:
                    merge_parts(self.run_dir, self.rank)
                except Exception as exc:
                    self._count_error("merge", exc)
            self._write_meta(final)

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
    def _guard(self, where: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            self._count_error(where, exc)
            return None

    def _count_error(self, where: str, exc: BaseException) -> None:
        self.errors += 1
        writer = getattr(self, "_writer", None)
        if writer is not None and writer.alive:
            # Already counted in self.errors: the writer only records the event.
            writer.submit(lambda w: w.record_error(where, exc, count=False), "events")
        else:
            key = f"{where}:{type(exc).__name__}"
            if key not in self._error_kinds:
                self._error_kinds.add(key)
                print(f"tracealyze: recorder error in {where} ({type(exc).__name__}: {exc});"
                      " training continues", file=sys.stderr)

    def _step(self, loss: Any, step: int | None, lr: Any, metrics: dict[str, Any]) -> None:
        with self._lock:
            acc = self._acc
            now = time.time()
            pending = self._pending
            if pending is not None:
                if pending.grads_captured:
                    # Gradients read: fold this call in only if the optimizer stepped in the
                    # middle of the cycle's last micro-batch (`backward(); opt.step();
                    # rec.step()`); otherwise (e.g. a step the GradScaler skipped, so no
                    # post-hook came) the pending step is complete as it is.
                    fold = pending.await_last
                else:
                    # rec.step() again before the optimizer stepped: a micro-batch of
                    # gradient accumulation if a backward ran in between (fold it: a
                    # recorded step is an optimizer step); else a step without an optimizer
                    # step (evaluation, a skipped step), complete as it is.
                    fold = self._grad_signature() != self._pending_sig
                if fold:
                    acc = pending
                    self._fold_into(acc, self._acc)
                    self._pending_sig = self._grad_signature()
                else:
                    self._commit(pending)
                    self._pending = None
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
            self._acc = StepAccum(step=acc.step + 1)
            if self._act is not None and self.config.activation_stats_every:
                self._act.hook_all(self._due(self.config.activation_stats_every,
                                             self._acc.step))
            if acc.grads_captured or (self.optimizer is None and self.scaler is None):
                if not acc.grads_captured:
                    self._capture_grads(acc)  # no optimizer: gradients are read here
                self._pending = None
                self._commit(acc)
            else:
                # Optimizer given but it has not stepped yet (rec.step() before opt.step()):
                # its hooks attach the gradients (and update ratios), then commit.
                self._pending = acc
                self._pending_sig = self._grad_signature()
            if self._profiler is not None:
                self._profiler.after_step()
                self._profiler.before_step(self._acc.step)

    def _drop_values(self, step: int, bad: list[tuple[str, Any]]) -> None:
        """rec.step() values that are not numbers: dropped one by one (the step and its number
        stay), counted as dropped ``step_values``, reported once."""
        self._writer.dropped["step_values"] += len(bad)
        if "step_values" in self._error_kinds:
            return
        self._error_kinds.add("step_values")
        name, value = bad[0]
        what = f"{type(value).__name__} {str(value)[:60]!r}"
        print(f"tracealyze: rec.step() value {name}={what} is not a number; dropped (the step "
              "is kept; further bad values are only counted)", file=sys.stderr)
        self.event("dropped_data", f"rec.step() value {name!r} is not a real number ({what}); "
                   "it was dropped, the step kept", severity="warning", subject=name,
                   step_values=len(bad))

    def _grad_signature(self) -> tuple[int, int] | None:
        """Identity and in-place version of the first gradient: changes with every backward
        pass (a new tensor after zero_grad(set_to_none=True), a version bump when
        accumulating into an existing one). One attribute read, no device work."""
        for _, p in self._named_params:
            g = p.grad
            if g is not None:
                return id(g), g._version
        return None

    @staticmethod
    def _fold_into(target: StepAccum, extra: StepAccum) -> None:
        target.tensors.extend(extra.tensors)
        target.pieces.extend(extra.pieces)
        target.to_probe.extend(extra.to_probe)
        target.probes.extend(extra.probes)
        target.act_stats.extend(extra.act_stats)
        target.metrics.update(extra.metrics)
        target.data_wait_s += extra.data_wait_s
        target.waited = target.waited or extra.waited

    def _hook_target(self) -> StepAccum:
        """The step an optimizer/scaler hook belongs to: the pending one when rec.step()
        came first, else the open one."""
        return self._pending if self._pending is not None else self._acc

    def _capture_from_hook(self) -> None:
        with self._lock:
            target = self._hook_target()
            if not target.grads_captured:
                self._capture_grads(target)
                if target is self._pending:
                    # A backward ran after the last rec.step(): that micro-batch's
                    # rec.step() is still to come and belongs to this optimizer step.
                    target.await_last = self._grad_signature() != self._pending_sig

    def _capture_scale(self, acc: StepAccum | None = None) -> None:
        """The loss scale this step was trained with, read at unscale_ (before
        scaler.update() changes it for the next step); a device tensor, no sync."""
        acc = acc if acc is not None else self._hook_target()
        scale = getattr(self.scaler, "_scale", None)
        if isinstance(scale, torch.Tensor) and not acc.has("loss_scale"):
            if scale.device.type == "cpu":
                acc.add_scalar("loss_scale", scale)  # read now: CPU, no sync
            else:  # a copy: scaler.update() changes _scale in place before the commit
                acc.add(Piece("loss_scale", 1), scale.detach().reshape(1).float().clone())

    # The optimizer hooks run right after backward and right after the optimizer step, when
    # the interpreter's caches are cold: each Python call there costs several times what it
    # does in a loop. So each hook is one guarded call that checks what is due first.
    def _on_opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if is_compiling():  # a compiled optimizer step: telemetry must not break the graph
            return
        try:
            self._capture_from_hook()
            if self.config.update_ratio_every:
                self._snapshot_params()
        except Exception as exc:
            self._count_error("optimizer_hook", exc)

    def _on_opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if is_compiling():
            return
        try:
            if self._update_snapshot is not None:
                self._guard("optimizer_hook", self._update_ratio)
            pending = self._pending
            if pending is None or not pending.grads_captured or pending.await_last:
                return  # rec.step() came after opt.step() (the usual order): it commits
            with self._lock:
                if self._pending is pending:
                    self._pending = None
                    self._commit(pending)
        except Exception as exc:
            self._count_error("optimizer_hook", exc)

    def _grads(self) -> tuple[list[torch.Tensor], _GradLayout]:
        # One pass over the parameters collecting .grad references (a host-side attribute
        # read each, no device work). Which parameters have one (frozen ones have none) is
        # compared as a list of flags; everything else about that set is worked out once.
        grads = [p.grad for p in self._params]
        present = [g is not None for g in grads]
        layout = self._grad_layout
        if layout is None or layout.present != present:
            self._grad_layout = layout = _GradLayout(self._named_params, grads, present)
        if layout.select is not None:  # frozen parameters, sparse gradients
            grads = list(compress(grads, layout.select))
        return grads, layout

    def _grad_norms(self, grads: list[torch.Tensor], layout: _GradLayout
                    ) -> tuple[Piece, torch.Tensor]:
        """This step's per-parameter gradient norms as a piece and its device vector: the
        layout's cached plan when it was found uniform (one device, fp16/bf16/fp32), else the
        checked path. Values come in the plan's order, labelled by the cached names."""
        if layout.plan is not None:
            try:
                return layout.plan_piece, layout.plan(grads)
            except RuntimeError:  # dtype/device changed under the same names: re-check
                self._grad_layout = None
        return layout.piece, norms(grads)

    def _due(self, every: int, step: int) -> bool:
        return every > 0 and step % every == 0

    def _capture_grads(self, acc: StepAccum) -> None:
        acc.grads_captured = True
        cfg = self.config
        if self.model is None:
            return
        norms_due = self._due(cfg.grad_norm_every, acc.step)
        stats_due = self._due(cfg.tensor_stats_every, acc.step)
        grads, layout = self._grads() if norms_due or stats_due else ([], None)
        if grads:
            if norms_due:
                acc.add(*self._grad_norms(grads, layout))
            if stats_due:
                acc.add(Piece("grad", len(grads) * 8, layout.names,
                              tuple(g.numel() for g in grads)), self._full(grads))
        if self._due(cfg.param_stats_every, acc.step) and self._named_params:
            ps = [p.detach() for _, p in self._named_params]
            acc.add(Piece("param", len(ps) * 8, tuple(n for n, _ in self._named_params),
                          tuple(p.numel() for p in ps)), self._full(ps))

    def _snapshot_params(self) -> None:
        if self._due(self.config.update_ratio_every, self._hook_target().step):
            # A copy of the trainable parameters (debug cadence only): the update is
            # new - old after the optimizer step.
            params = [p.detach() for _, p in self._named_params if p.requires_grad]
            self._update_snapshot = torch._foreach_mul(params, 1.0) if params else None

    def _update_ratio(self) -> None:
        old, self._update_snapshot = self._update_snapshot, None
        if old is None:
            return
        pairs = [(n, p.detach()) for n, p in self._named_params if p.requires_grad]
        new = [p for _, p in pairs]
        delta = torch._foreach_sub(new, old)
        m = torch.stack([norms(delta), norms(new)], dim=1)
        self._hook_target().add(Piece("update", len(new) * 2, tuple(n for n, _ in pairs),
                                      tuple(p.numel() for p in new)), m)

    def _on_activation(self, index: int, t: torch.Tensor) -> None:
        cfg = self.config
        acc = self._acc
        if acc.act_seq >= _MAX_ACT_PIECES:  # rec.step() not called for a long time: bound
            return                          # the memory the open step holds
        acc.act_seq += 1
        name = self._act.names[index] if self._act else str(index)
        if cfg.activation_nonfinite:
            acc.to_probe.append((name, t.numel(), acc.act_seq, t, t._version))
        if self._due(cfg.activation_stats_every, acc.step):
            acc.act_stats.append((name, t.numel(), acc.act_seq, self._full.one(t)))

    def _on_input(self, t: torch.Tensor) -> None:
        if self.config.activation_nonfinite:
            self._acc.to_probe.append(("<input>", t.numel(), 0, t, t._version))

    def _on_forward_end(self) -> None:
        self._guard("activation_probe", self._probe_outputs, self._acc)

    def _probe_outputs(self, acc: StepAccum) -> None:
        """Probe the module outputs collected during the forward pass that just ended, all
        at once, and drop the references (until then they keep those outputs alive)."""
        if acc.to_probe:
            names, numels, seqs, ts, versions = zip(*acc.to_probe, strict=True)
            acc.to_probe = []
            # An output modified in place after its module returned (ReLU(inplace=True),
            # `out += x`, masked_fill_) is probed with its later values: flagged, so that
            # it alone never raises a NaN alarm (host-side version counters, no device work).
            late = tuple(t._version != v for t, v in zip(ts, versions, strict=True))
            acc.probes.append((names, numels, seqs, late, nonfinite_probes(list(ts))))

    def _watch(self, name: str, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor):
            tensor = torch.as_tensor(tensor)
        if tensor.is_complex():
            tensor = tensor.abs()
        acc = self._acc
        acc.add(Piece("watch", 8, (str(name),), (tensor.numel(),)),
                self._full.one(tensor))

    def _commit(self, acc: StepAccum) -> None:
        # Per-module NaN probes and activation statistics, in forward-completion order: one
        # piece each (one stack/cat here instead of a piece per module to split back out).
        if acc.to_probe:  # a forward whose model call did not return (or a submodule)
            self._probe_outputs(acc)
        if acc.probes:
            blocks = acc.probes
            if len(blocks) == 1:  # one forward pass
                names, numels, seqs, late, vec = blocks[0]
            else:  # micro-batches: one block per forward pass
                names, numels, seqs, late = (sum((b[k] for b in blocks), ()) for k in range(4))
                vec = torch.cat([b[4] for b in blocks])
            acc.add(Piece("act_nf", len(names), names, numels, seqs, late=late), vec)
        if acc.act_stats:
            names, numels, seqs, vals = zip(*acc.act_stats, strict=True)
            acc.add(Piece("activation", 8 * len(vals), names, numels, seqs), torch.cat(vals))
        host, event = pack(acc)
        memory = self._due(self.config.memory_every, acc.step)
        item = StepItem(
            step=acc.step, time=acc.ended or time.time(), duration_s=acc.duration_s,
            data_wait_s=acc.data_wait_s if acc.waited else None,
            floats=acc.floats, metrics=acc.metrics, pieces=acc.pieces, host=host, event=event,
            scaler=acc.scaler, memory=memory, probe=self._probe,
            rss=self._probe.rss() if memory else None, nonfinite_state=self._nonfinite_state,
            store_grad_norms=self.config.store_grad_norms,
        )
        self._next_step = acc.step + 1
        self._rank_meta["steps"] = self._rank_meta.get("steps", 0) + 1
        self._writer.submit(item, "steps")

    def _emit_system(self, row: dict[str, Any]) -> None:
        self._writer.submit(lambda w: w.append("system", {k: [v] for k, v in row.items()}),
                            "system")

    def _record_exception(self, exc: BaseException) -> None:
        try:
            stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            msg = f"{type(exc).__name__}: {exc}"
            details: dict[str, Any] = {"type": type(exc).__name__}
            subject = None
            if "returned nan values" in str(exc).lower() or "nan" in type(exc).__name__.lower():
                details["anomaly"] = True
                subject = str(exc).split("'")[1] if "'" in str(exc) else None
            if "out of memory" in str(exc).lower():
                details["oom"] = True
                try:
                    details["memory"] = self._probe.snapshot()
                except Exception:
                    pass
            row = event_row(self._acc.step, "exception", msg, severity="critical",
                            subject=subject, stack=stack, details=details)
            self._writer.submit(lambda w: w.append("events", row), "events")
            self._status = "crashed"
        except Exception as e:  # recording the crash must not mask it
            self._count_error("exception", e)

    def _teardown_hooks(self) -> None:
        for h in self._handles:
            try:
                h.remove()
            except Exception:
                pass
        self._handles = []
        if self._act is not None:
            self._act.remove()
        if self.scaler is not None and hasattr(self, "_scaler_original"):
            try:
                del self.scaler.unscale_  # drop the instance attribute: the method is back
            except AttributeError:
                pass
        if sys.excepthook is getattr(self, "_excepthook", None):
            sys.excepthook = self._prev_excepthook
        if warnings.showwarning is getattr(self, "_showwarning", None):
            warnings.showwarning = self._prev_showwarning
        if self._prev_sigterm is not None:
            try:
                if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                    signal.signal(signal.SIGTERM, self._prev_sigterm)
            except (ValueError, OSError):
                pass
        try:
            atexit.unregister(self._atexit)
        except Exception:
            pass
        if self.config.anomaly_mode:
            torch.autograd.set_detect_anomaly(False)

    def _counters(self) -> dict[str, Any]:
        return {"dropped": dict(self._writer.dropped),
                "recorder_errors": self.errors + self._writer.errors}

    def _adopt_run_id(self) -> None:
        if self.rank != 0 and not self._rank_meta.get("run_id"):
            self._rank_meta["run_id"] = (read_json(self.run_dir / "run.json") or {}).get(
                "run_id")

    def _heartbeat(self) -> None:
        """Called by the writer after each successful flush (writer thread)."""
        now = time.time()
        self._adopt_run_id()
        self._rank_meta.update(heartbeat=now, counters=self._counters())
        write_json_atomic(self.run_dir / "ranks" / f"rank={self.rank}.json", self._rank_meta)
        if self.rank == 0:
            self._meta.update(heartbeat=now, counters=self._counters())
            write_json_atomic(self.run_dir / "run.json", self._meta)

    def _write_meta(self, status: str) -> None:
        now = time.time()
        try:
            self._adopt_run_id()
            self._rank_meta.update(status=status, ended=now, heartbeat=now,
                                   counters=self._counters())
            write_json_atomic(self.run_dir / "ranks" / f"rank={self.rank}.json",
                              self._rank_meta)
            if self.rank == 0:
                self._meta.update(status=status, ended=now, heartbeat=now,
                                  counters=self._counters())
                write_json_atomic(self.run_dir / "run.json", self._meta)
        except Exception as exc:
            self._count_error("run.json", exc)


class _GradLayout:
    """What is known about one set of parameters with gradients, worked out once (per-tensor
    checks are a Python loop: never per step). Sparse gradients are left out. ``piece``
    labels norms in parameter order (the checked path); ``plan_piece`` labels the plan's
    output order, and its ``seqs`` give each value's parameter position, so the writer can
    still name the first parameter (in parameter order) whose gradient went nonfinite."""

    def __init__(self, named: list[tuple[str, nn.Parameter]], grads: list[Any],
                 present: list[bool]) -> None:
        self.present = present
        keep = [ok and not g.is_sparse for g, ok in zip(grads, present, strict=True)]
        self.select = None if all(keep) else keep
        # The same tuple object every step: rows.Codes maps it to codes once.
        self.names = tuple(compress((n for n, _ in named), keep))
        grads = list(compress(grads, keep))
        self.piece = Piece("grad_norms", len(grads), self.names)
        self.plan = NormPlan(grads) if stats.uniform(grads) else None
        order = self.plan.order if self.plan is not None else None
        self.plan_piece = self.piece if order is None else Piece(
            "grad_norms", len(grads), tuple(self.names[i] for i in order), seqs=order)


def _inert_after_fork(ref: weakref.ref[Recorder]) -> None:
    rec = ref()
    if rec is not None:
        rec._closed = True


def _last_step(run_dir: Path, rank: int) -> int | None:
    """Highest step already recorded by this rank (for resume); unreadable parts ignored."""
    import pyarrow.parquet as pq

    d = run_dir / "steps" / f"rank={rank}"
    best = None
    if d.is_dir():
        for p in d.glob("part-*.parquet"):
            try:
                col = pq.read_table(p, columns=["step"]).column("step")
                if len(col):
                    m = max(v for v in col.to_pylist() if v is not None)
                    best = m if best is None else max(best, m)
            except Exception:
                continue
    return best


class _TimedLoader:
    """Iterates a loader and adds the time spent waiting for each batch to the step."""

    def __init__(self, loader: Iterable[Any], rec: Recorder) -> None:
        self.loader = loader
        self.rec = rec

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.loader)
        rec = self.rec
        clock = time.perf_counter
        while True:
            t0 = clock()
            try:
                batch = next(it)
            except StopIteration:
                return
            waited = clock() - t0
            if not rec._closed:
                acc = rec._acc
                acc.data_wait_s += waited
                acc.waited = True
            yield batch

