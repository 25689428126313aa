"""Scheduled torch.profiler windows, written as Chrome/Kineto traces under traces/rank=<r>/."""

from __future__ import annotations

import gzip
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


class ProfilerSchedule:
    """Opens a profiler window of ``warmup + active`` steps ending at each scheduled point.

    Windows start at ``start`` and then every ``every`` steps (if > 0), at most
    ``max_windows`` times. ProfilerStep#N labels in the trace carry the recorder's own step
    numbers, so the analyzer can join trace events to recorded steps.
    """

    def __init__(self, *, start: int, every: int, warmup: int, active: int, max_windows: int,
                 trace_dir: Path, cuda: bool,
                 submit: Callable[[Callable[[Any], None]], bool],
                 on_window: Callable[[int, int], None] | None = None) -> None:
        """``on_window(first_step, last_step)`` is told each window once it closed (the
        recorder writes a ``profiler_window`` event: the analyzer discounts the memory the
        profiler keeps, which is the recorder's own, not the training's)."""
        self.start, self.every, self.warmup, self.active = start, every, warmup, active
        self.max_windows = max_windows
        self.trace_dir = trace_dir
        self.cuda = cuda
        self.submit = submit
        self.on_window = on_window
        self.windows = 0
        self.prof: Any = None
        self._left = 0
        self._first = 0

    @classmethod
    def of(cls, config: Any, trace_dir: Path, *, cuda: bool,
           submit: Callable[[Callable[[Any], None]], bool],
           on_window: Callable[[int, int], None]) -> ProfilerSchedule | None:
        """The schedule a RecorderConfig asks for, or None when it profiles nothing."""
        if config.profile_start <= 0 and config.profile_every <= 0:
            return None
        if config.profile_quiet:
            # Read once, when Kineto first starts: before the first window. Level 6 is
            # above USDT (5), which is above ERROR (4): no finer setting exists.
            os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        return cls(start=config.profile_start, every=config.profile_every,
                   warmup=config.profile_warmup, active=config.profile_active,
                   max_windows=config.profile_max_windows, trace_dir=trace_dir, cuda=cuda,
                   submit=submit, on_window=on_window)

    def _window_starts_at(self, step: int) -> bool:
        first = self.start - self.warmup
        if step < max(first, 0) or self.windows >= self.max_windows:
            return False
        if step == max(first, 0):
            return True
        return self.every > 0 and (step - first) % self.every == 0

    def before_step(self, step: int) -> None:
        """Called when step ``step`` begins (right after the previous one was recorded)."""
        if self.prof is not None or not self._window_starts_at(step):
            return
        if torch.autograd.profiler._is_profiler_enabled:  # the user profiles already
            return
        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self._first = step
        self._left = self.warmup + self.active
        self.prof = torch.profiler.profile(
            activities=acts,
            # skip_first=step because step_num starts at `step` (below): the schedule is a
            # function of step_num.
            schedule=torch.profiler.schedule(wait=0, warmup=self.warmup, active=self.active,
                                             repeat=1, skip_first=step),
            on_trace_ready=self._ready, record_shapes=False, with_stack=False,
        )
        self.prof.step_num = step  # ProfilerStep#<recorder step>
        self.prof.start()

    def after_step(self) -> None:
        """Called when a step has been recorded."""
        if self.prof is None:
            return
        self.prof.step()
        self._left -= 1
        if self._left <= 0:
            self.stop()

    def stop(self) -> None:
        if self.prof is None:
            return
        prof, self.prof = self.prof, None
        self.windows += 1
        prof.stop()  # (exports the trace: _ready)
        # The window's events (~2 MiB of malloc'd memory for a small model) sit in a
        # reference cycle that only a full garbage collection frees, at a moment nobody
        # chose: a drop in the heap hundreds of steps later, read as the training's memory
        # by a leak check. Drop them now that the trace is on disk.
        prof.profiler = None
        if self.on_window is not None:
            self.on_window(self._first, self._first + self.warmup + self.active - 1
                           - max(0, self._left))

    def _ready(self, prof: Any) -> None:
        # Exporting must happen here, on the training thread (the profiler's data lives in
        # it); compressing and renaming the file is left to the writer thread.
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        first = self._first + self.warmup
        name = f"step{first:06d}-{first + self.active - 1:06d}"
        tmp = self.trace_dir / f".{name}.{os.getpid()}.json.tmp"
        prof.export_chrome_trace(str(tmp))
        final = self.trace_dir / f"{name}.pt.trace.json.gz"
        self.submit(lambda _w: _gzip_into_place(tmp, final))


def _gzip_into_place(src: Path, final: Path) -> None:
    part = final.with_name(f".{final.name}.tmp")
    with open(src, "rb") as fi, gzip.open(part, "wb", compresslevel=5) as fo:
        shutil.copyfileobj(fi, fo, 1 << 20)
    os.replace(part, final)
    src.unlink()
