"""``steps.new_shapes``: the batches of a step whose signature (shapes and dtypes of their
tensors) was new, from the batches the recorder is handed (``wrap_loader``), on a
nanoGPT-style model with variable sequence lengths through a real DataLoader and a ResNet
on variable image sizes, checked against a count the test keeps itself; dict batches (as
Hugging Face collators make them); gradient accumulation; a loop that hands the recorder
no batch (the shapes of the model's first forward of each step, the hook off during the
forward); keyword-only forwards; a full log; and the user's model left as it was
(``torch.save(model)`` pickles nothing of tracealyze)."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import torch
from rec_helpers import FAST
from torch.utils.data import DataLoader, Dataset
from tracealyze.recorder import Recorder
from tracealyze.recorder.tensors import modhooks
from tracealyze.recorder.training import shapes as shapes_mod

from tests.matrix.models import VOCAB, NanoGPT, ResNet


def _column(run: Path) -> list:
    rows = ds.dataset(run / "steps", partitioning="hive").to_table().to_pylist()
    return [r["new_shapes"] for r in sorted(rows, key=lambda r: r["step"])]


class _Lengths(Dataset):
    """Token sequences whose length varies by index (lengths recur)."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int) -> torch.Tensor:
        t = 4 + (i * 7) % 9
        return torch.randint(0, VOCAB, (t,), generator=torch.Generator().manual_seed(i))


def test_new_lengths_from_a_dataloader_are_counted_at_their_step(tmp_path):
    torch.manual_seed(0)
    model = NanoGPT(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(_Lengths(), batch_size=1, shuffle=True,
                        generator=torch.Generator().manual_seed(3))
    seen: set[tuple] = set()
    want = []
    with Recorder(tmp_path / "r", model=model, optimizer=opt, **FAST) as rec:
        for ids in rec.wrap_loader(loader):
            want.append(int((ids.shape, ids.dtype) not in seen))
            seen.add((ids.shape, ids.dtype))
            logits = model(ids)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                                     ids.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    assert _column(tmp_path / "r") == want
    assert sum(want) == 9 and len(want) == 48  # nine lengths, each new once


def test_image_sizes_on_a_resnet_with_accumulation(tmp_path):
    """Two micro-batches a step: the step's count is how many of them were new."""
    torch.manual_seed(0)
    model = ResNet(0)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    sizes = [16, 20, 16, 16, 24, 20, 16, 28, 28, 16]
    batches = [(torch.randn(2, 3, s, s), torch.randint(0, 8, (2,))) for s in sizes]
    with Recorder(tmp_path / "r", model=model, optimizer=opt, **FAST) as rec:
        for i, (x, y) in enumerate(rec.wrap_loader(batches)):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            if i % 2 == 1:
                opt.step()
                opt.zero_grad()
                rec.step()
    assert _column(tmp_path / "r") == [2, 0, 1, 1, 0]


def test_dict_batches_and_no_batches(tmp_path):
    emb = torch.nn.Embedding(50, 8)
    opt = torch.optim.SGD(emb.parameters(), lr=1e-2)
    batches = [{"input_ids": torch.zeros(2, t, dtype=torch.long),
                "attention_mask": torch.ones(2, t)} for t in (5, 5, 7, 5)]
    with Recorder(tmp_path / "kw", model=emb, optimizer=opt, **FAST) as rec:
        for b in rec.wrap_loader(batches):
            loss = (emb(b["input_ids"]) * b["attention_mask"][..., None]).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    assert _column(tmp_path / "kw") == [1, 0, 1, 0]
    with Recorder(tmp_path / "none", optimizer=opt, **FAST) as rec:
        for _ in range(3):  # no loader and no model: nothing to read shapes from
            loss = emb(torch.zeros(1, dtype=torch.long)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    assert _column(tmp_path / "none") == [None] * 3


class _Probe(torch.nn.Module):
    """A layer that notes whether torch's process-wide forward hooks were live when it ran
    (they route every module call of the process through a dispatch)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.nn.modules import module as m

        self.live.append(len(m._global_forward_pre_hooks) + len(m._global_forward_hooks))
        return x


def test_shapes_read_at_the_models_forwards_without_a_loader(tmp_path):
    """A loop that builds its own tensors and calls the model: the first forward of each
    step is read, and the first after each backward (the next micro-batch, an evaluation
    after the update); a second forward with no backward between is not; the hook is off
    while a forward runs, and the model pickles as it was while it is armed."""
    torch.manual_seed(0)
    probe = _Probe()
    model = torch.nn.Sequential(probe, torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    sizes = [8, 8, 12, 8, 16, 12, 20, 8]
    with Recorder(tmp_path / "r", model=model, optimizer=opt, **FAST) as rec:
        for i, s in enumerate(sizes):
            if i == 5:  # an evaluation first: its first image is read, the second is not
                with torch.no_grad():
                    model(torch.randn(1, 3, 30, 30))
                    model(torch.randn(1, 3, 34, 34))
            opt.zero_grad()
            model(torch.randn(2, 3, s, s)).square().mean().backward()
            if i == 3:  # a second micro-batch of a new size, after the first's backward
                model(torch.randn(2, 3, 24, 24)).square().mean().backward()
            opt.step()
            if i == 6:  # an evaluation after the update, on a new size
                with torch.no_grad():
                    model(torch.randn(1, 3, 40, 40))
            rec.step()
            buf = io.BytesIO()
            torch.save(model, buf)  # the hook is armed now, outside the model
            assert b"tracealyze" not in buf.getvalue()
    # 8 new; 8; 12 new; 8 + 24 new; 16 new; 30 new (34 and 12 unread); 20 new + 40 new; 8
    assert _column(tmp_path / "r") == [1, 0, 1, 1, 1, 1, 2, 0]
    # the standard preset's first-step probes aside, no forward ran under the dispatch
    assert probe.live[-6:] == [0] * 6
    assert not modhooks._pre and not modhooks._handles  # closing took the hook off


def test_keyword_only_forwards_leave_the_column_null(tmp_path):
    """torch's process-wide pre-hooks see positional arguments only: a model called with
    keywords (``model(input_ids=...)``) has no signature to read."""

    class KW(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(20, 4)

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.emb(input_ids)

    model = KW()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with Recorder(tmp_path / "r", model=model, optimizer=opt, **FAST) as rec:
        for t in (3, 5, 3):
            loss = model(input_ids=torch.zeros(2, t, dtype=torch.long)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    assert _column(tmp_path / "r") == [None] * 3


def test_a_full_log_stops_counting(tmp_path, monkeypatch):
    monkeypatch.setattr(shapes_mod, "MAX_SIGNATURES", 3)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    batches = [torch.randn(b, 4) for b in (1, 2, 3, 1, 4, 5)]
    with Recorder(tmp_path / "r", model=model, optimizer=opt, **FAST) as rec:
        for x in rec.wrap_loader(batches):
            loss = model(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    got = _column(tmp_path / "r")
    assert got[:4] == [1, 1, 1, 0]
    assert got[4:] == [None, None]


def test_the_users_model_pickles_without_tracealyze(tmp_path):
    """``torch.save(model)`` under the standard preset, before the first step (an initial
    checkpoint) and after each: the checkpoint holds nothing of ours (it must load where
    tracealyze is not installed), and the save does not fail on a probe's closure (the
    first forward's structure probe and the FLOP counter's hook used to sit on the model:
    "Can't pickle local object")."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with Recorder(tmp_path / "r", model=model, optimizer=opt, **FAST) as rec:
        buf = io.BytesIO()
        torch.save(model, buf)
        assert b"tracealyze" not in buf.getvalue()
        for x in rec.wrap_loader([torch.randn(b, 4) for b in (2, 3, 2)]):
            loss = model(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            buf = io.BytesIO()
            torch.save(model, buf)  # mid-run, as a checkpoint would
            assert b"tracealyze" not in buf.getvalue()
        # the first steps' probes are gone: the model's calls take torch's fast path again
        ids = {id(m) for m in model.modules()}
        assert not ids & (set(modhooks._pre) | set(modhooks._post))


@pytest.mark.parametrize("batch", [(torch.zeros(2, 3), [torch.zeros(1), 7]),
                                   {"x": {"a": torch.zeros(2, dtype=torch.long)}},
                                   torch.zeros(3)])
def test_signature_reads_nested_tensors(batch):
    """Tensors in a tuple, a list inside it, a mapping inside a mapping, a bare tensor."""
    sig = shapes_mod.signature(batch)
    assert sig and all(isinstance(s, tuple) and len(s) == 2 for s in sig)

