"""``steps.new_shapes``: the model's forward calls in a step whose input signature was new
(training and evaluation alike), on a nanoGPT-style model with variable sequence lengths
and a ResNet on variable image sizes, checked against a count the test keeps itself; a
keyword-argument batch (as Hugging Face models take it); no model; a full log."""

from __future__ import annotations

from pathlib import Path

import pyarrow.dataset as ds
import pytest
import torch
from rec_helpers import FAST
from tracealyze.recorder import Recorder
from tracealyze.recorder.training import shapes as shapes_mod

from tests.matrix.models import VOCAB, NanoGPT, ResNet


def _column(run: Path) -> list:
    rows = ds.dataset(run / "steps", partitioning="hive").to_table().to_pylist()
    return [r["new_shapes"] for r in sorted(rows, key=lambda r: r["step"])]


def test_new_lengths_are_counted_at_their_step_training_and_evaluation(tmp_path):
    torch.manual_seed(0)
    model = NanoGPT(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rng = torch.Generator().manual_seed(1)
    seen: set[tuple] = set()
    want = []
    with Recorder(tmp_path / "r", model=model, optimizer=opt, **FAST) as rec:
        for step in range(24):
            n = 0
            t = int(torch.randint(4, 12, (1,), generator=rng))  # lengths recur
            ids = torch.randint(0, VOCAB, (2, t), generator=rng)
            logits = model(ids)
            n += (ids.shape, ids.dtype) not in seen
            seen.add((ids.shape, ids.dtype))
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                                     ids.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 6 == 5:  # an evaluation forward on a longer batch: same caches
                ev = torch.randint(0, VOCAB, (3, t + 1), generator=rng)
                with torch.no_grad():
                    model(ev)
                n += (ev.shape, ev.dtype) not in seen
                seen.add((ev.shape, ev.dtype))
            want.append(n)
            rec.step(loss=loss)
    got = _column(tmp_path / "r")
    assert got == want
    assert 0 < sum(want) < 24  # the test means something: some steps new, some not


def test_image_sizes_on_a_resnet(tmp_path):
    torch.manual_seed(0)
    model = ResNet(0)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    sizes = [16, 20, 16, 24, 20, 16, 28, 16]
    with Recorder(tmp_path / "r", model=model, optimizer=opt, **FAST) as rec:
        for s in sizes:
            x = torch.randn(2, 3, s, s)
            loss = model(x).logsumexp(-1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    assert _column(tmp_path / "r") == [1, 1, 0, 1, 0, 0, 1, 0]


class _KwModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return (self.emb(input_ids) * attention_mask[..., None]).sum()


def test_keyword_batches_and_a_missing_model(tmp_path):
    model = _KwModel()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with Recorder(tmp_path / "kw", model=model, optimizer=opt, **FAST) as rec:
        for t in (5, 5, 7, 5):
            loss = model(input_ids=torch.zeros(2, t, dtype=torch.long),
                         attention_mask=torch.ones(2, t))
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    assert _column(tmp_path / "kw") == [1, 0, 1, 0]
    assert not model._forward_pre_hooks  # closed: no hook of ours left on the model
    with Recorder(tmp_path / "none", **FAST) as rec:  # no model: nothing counted
        for _ in range(3):
            rec.step(loss=1.0)
    assert _column(tmp_path / "none") == [None] * 3


def test_a_full_log_stops_counting(tmp_path, monkeypatch):
    monkeypatch.setattr(shapes_mod, "MAX_SIGNATURES", 3)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with Recorder(tmp_path / "r", model=model, optimizer=opt, **FAST) as rec:
        for b in (1, 2, 3, 1, 4, 5):
            loss = model(torch.randn(b, 4)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    got = _column(tmp_path / "r")
    assert got[:4] == [1, 1, 1, 0]
    assert got[4:] == [None, None]


@pytest.mark.parametrize("args", [((torch.zeros(2, 3), [torch.zeros(1), 7]), {}),
                                  ((), {"x": {"a": torch.zeros(2, dtype=torch.long)}})])
def test_signature_reads_nested_tensors(args):
    sig = shapes_mod.signature(*args)
    assert sig and all(isinstance(s, tuple) and len(s) == 2 for s in sig)
