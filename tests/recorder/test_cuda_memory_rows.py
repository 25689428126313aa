"""The CUDA allocator's counters belong to their step (issue 44, item 1), and a CUDA OOM
leaves the allocator's snapshot in the run (item 3).

No GPU here: the allocator is replaced by a fake that the training loop drives (each step
keeps 3 GiB more, like ../shared/gpu-runs/gpu_oom_leak, with a transient 1 GiB spike every
third step), so what each row must hold is known exactly. The recorder's writer flushes
once, at close: with counters read when the writer runs, every row would say the same.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from rec_helpers import batches, events, rows, tiny_model
from tracealyze.recorder import Recorder
from tracealyze.recorder.training import oom as oom_mod
from tracealyze.recorder.training.cudamem import CudaCounters

GIB = 1 << 30


class FakeAllocator:
    """The counters of ``torch._C._cuda_memoryStats``, with the allocator's high-water mark
    (never reset by anyone but :meth:`reset_peak`)."""

    def __init__(self) -> None:
        self.current = 0
        self.mark = 0
        self.calls = 0

    def alloc(self, n: int) -> None:
        self.current += n
        self.mark = max(self.mark, self.current)

    def free(self, n: int) -> None:
        self.current -= n

    def reset_peak(self) -> None:
        self.mark = self.current

    def __call__(self, index: int) -> dict[str, Any]:
        self.calls += 1
        pool = {"current": self.current, "peak": self.mark, "allocated": 0, "freed": 0}
        return {"allocated_bytes": {"all": pool}, "reserved_bytes": {"all": {
            "current": self.current + GIB // 2}}, "num_alloc_retries": 0, "num_ooms": 0}


def _fake_cuda(rec: Recorder, fake: FakeAllocator) -> None:
    rec._probe.counters = CudaCounters(torch.device("cuda", 0), stats=fake)


def test_each_row_holds_its_own_steps_counters(tmp_path: Path) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    fake = FakeAllocator()
    with Recorder(tmp_path / "run", model=model, optimizer=opt,
                  flush_interval_s=3600, system_interval_s=0) as rec:
        _fake_cuda(rec, fake)
        for i, (x, y) in enumerate(batches(12)):
            fake.alloc(3 * GIB)            # the leak: kept for good
            if i % 3 == 2:                 # a transient spike inside the step
                fake.alloc(GIB)
                fake.free(GIB)
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    mem = sorted(rows(tmp_path / "run", "memory"), key=lambda r: r["step"])
    assert [r["step"] for r in mem] == list(range(12))
    assert [r["cuda_allocated_bytes"] for r in mem] == [3 * GIB * (i + 1) for i in range(12)]
    assert [r["cuda_reserved_bytes"] for r in mem] == [3 * GIB * (i + 1) + GIB // 2
                                                       for i in range(12)]
    # The window's peak: the spike in steps 2, 5, 8, 11 is visible in exactly those rows;
    # the others peak at their own end (the leak raises the mark every step).
    assert [r["cuda_peak_bytes"] for r in mem] == [
        3 * GIB * (i + 1) + (GIB if i % 3 == 2 else 0) for i in range(12)]
    assert [r["cuda_max_allocated_bytes"] for r in mem] == [r["cuda_peak_bytes"] for r in mem]


def test_window_peak_is_null_when_the_mark_did_not_move() -> None:
    """Steady training: the mark was set by an earlier step. The window's own peak is then
    unknown (the recorder never resets the user's mark), so it is null, not a guess."""
    fake = FakeAllocator()
    c = CudaCounters(torch.device("cuda", 0), stats=fake)
    fake.alloc(10 * GIB)
    fake.free(8 * GIB)
    first = c.read()
    assert first["cuda_peak_bytes"] == 10 * GIB  # since start: the mark is the window's
    fake.alloc(4 * GIB)
    fake.free(4 * GIB)                           # 6 GiB at most: below the mark
    second = c.read()
    assert second["cuda_peak_bytes"] is None
    assert second["cuda_max_allocated_bytes"] == 10 * GIB
    fake.alloc(9 * GIB)                          # 11 GiB: a new mark, in this window
    assert c.read()["cuda_peak_bytes"] == 11 * GIB
    fake.reset_peak()                            # the user's reset: mark = current
    assert c.read()["cuda_peak_bytes"] == 11 * GIB  # current sits at the mark: exact
    fake.free(5 * GIB)
    assert c.read()["cuda_peak_bytes"] is None   # below an unchanged mark: unknown


def test_counters_are_read_on_the_training_thread_at_commit(tmp_path: Path) -> None:
    """One allocator read per recorded memory step, made before rec.step() returns."""
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    fake = FakeAllocator()
    with Recorder(tmp_path / "run", model=model, optimizer=opt, memory_every=2,
                  flush_interval_s=3600, system_interval_s=0) as rec:
        _fake_cuda(rec, fake)
        for x, y in batches(6):
            before = fake.calls
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            rec.step()
            assert fake.calls - before == (1 if (rec.current_step - 1) % 2 == 0 else 0)


class _FakeOom(RuntimeError):
    pass


def test_cuda_oom_leaves_the_allocators_snapshot(tmp_path: Path, monkeypatch:
                                                 pytest.MonkeyPatch) -> None:
    """A CUDA OOM leaving the ``with``: the snapshot is written under
    memory_snapshots/rank=0/, atomically, named by the step, and announced by an event."""
    snap = {"segments": [{"address": 1, "total_size": 2 * GIB, "blocks": []}],
            "device_traces": [[{"action": "oom", "size": 3 * GIB}]]}
    monkeypatch.setattr(oom_mod.torch.cuda.memory, "_snapshot", lambda device=None: snap)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.raises(_FakeOom), Recorder(tmp_path / "run", model=model, optimizer=opt,
                                           system_interval_s=0) as rec:
        rec._oom.cuda = True  # (the device would be CUDA)
        for i, (x, y) in enumerate(batches(5)):
            if i == 3:
                raise _FakeOom("CUDA out of memory. Tried to allocate 3.00 GiB.")
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            rec.step()
    folder = tmp_path / "run" / "memory_snapshots" / "rank=0"
    assert [p.name for p in folder.iterdir()] == ["oom-step000003.pickle"]
    with open(folder / "oom-step000003.pickle", "rb") as f:
        assert pickle.load(f) == snap  # (our own file, written by this test's process)
    ev = events(tmp_path / "run", "memory_snapshot")
    assert len(ev) == 1 and "pytorch.org/memory_viz" in ev[0]["message"]
    assert '"path": "memory_snapshots/rank=0/oom-step000003.pickle"' in ev[0]["details"]


def test_other_exceptions_leave_no_snapshot(tmp_path: Path) -> None:
    model = tiny_model()
    with pytest.raises(ValueError), Recorder(tmp_path / "run", model=model,
                                             system_interval_s=0) as rec:
        rec._oom.cuda = True
        raise ValueError("not a memory problem")
    assert not (tmp_path / "run" / "memory_snapshots").exists()


def test_memory_history_is_a_validated_knob() -> None:
    from tracealyze.recorder.config import RecorderConfig

    assert RecorderConfig.from_preset("debug").memory_history > 0
    assert RecorderConfig.from_preset("standard").memory_history == 0
    with pytest.raises(ValueError):
        RecorderConfig.from_preset("standard", memory_history=-1)


def test_allocation_history_gathers_stacks_at_allocations_only(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tracealyze.recorder.training import oom

    calls: list[dict] = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda **kw: calls.append(kw))
    user_on = [False]
    monkeypatch.setattr(torch._C, "_cuda_isHistoryEnabled", lambda: user_on[0], raising=False)
    snaps = oom.OomSnapshots(tmp_path, 0, None, 0, lambda *a: None)
    snaps._start_history(1000)
    # frames at allocations (what the snapshot's live blocks and the leak's dating read),
    # not at frees: half the per-allocation cost of context="all"
    assert calls == [{"max_entries": 1000, "context": "alloc", "stacks": "python"}]
    snaps.remove()
    assert calls[-1] == {"enabled": None}  # ours, so turned off at close
    calls.clear()
    user_on[0] = True  # the user's own recording is left as they set it
    snaps = oom.OomSnapshots(tmp_path, 0, None, 0, lambda *a: None)
    snaps._start_history(1000)
    snaps.remove()
    assert calls == []


def test_armed_history_starts_once_the_device_is_near_full(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tracealyze.recorder.training import oom, sampler

    calls: list[dict] = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda **kw: calls.append(kw))
    monkeypatch.setattr(torch._C, "_cuda_isHistoryEnabled", lambda: False, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    probe = sampler.MemoryProbe(None)
    probe.total = 100 << 30
    said: list[tuple[str, dict]] = []
    snaps = oom.OomSnapshots(tmp_path, 0, torch.device("cuda", 0), 5000,
                             lambda m, d: said.append((m, d)), 0.8, probe)
    assert calls == [] and probe.on_counters == snaps.at_counters  # armed, not started
    gib = 1 << 30
    for reserved in (10 * gib, 60 * gib, 79 * gib):  # below 80% of the device: nothing
        probe.on_counters({"cuda_reserved_bytes": reserved})
    assert calls == [] and said == []
    probe.on_counters({"cuda_reserved_bytes": None})  # a row without counters: nothing
    probe.on_counters({"cuda_reserved_bytes": 81 * gib})
    assert calls == [{"max_entries": 5000, "context": "alloc", "stacks": "python"}]
    assert said and said[0][1] == {"reserved_bytes": 81 * gib} and "81.0 GiB" in said[0][0]
    probe.on_counters({"cuda_reserved_bytes": 90 * gib})  # once
    assert len(calls) == 1 and len(said) == 1
    snaps.remove()
    assert calls[-1] == {"enabled": None}


def test_history_from_the_start_when_no_threshold(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tracealyze.recorder.training import oom, sampler

    calls: list[dict] = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda **kw: calls.append(kw))
    monkeypatch.setattr(torch._C, "_cuda_isHistoryEnabled", lambda: False, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    probe = sampler.MemoryProbe(None)
    probe.total = 100 << 30
    snaps = oom.OomSnapshots(tmp_path, 0, torch.device("cuda", 0), 5000,
                             lambda m, d: None, 0.0, probe)
    assert len(calls) == 1 and snaps.armed is None and probe.on_counters is None


def test_memory_history_at_is_validated_and_debug_arms_at_80_percent() -> None:
    from tracealyze.recorder.config import RecorderConfig

    assert RecorderConfig.from_preset("debug").memory_history_at == 0.8
    assert RecorderConfig.from_preset("standard").memory_history_at == 0.0
    for bad in (-0.1, 1.0, 2):
        with pytest.raises(ValueError, match="memory_history_at"):
            RecorderConfig.from_preset("debug", memory_history_at=bad)
