"""The backward NaN/Inf probes are reduced in a bounded number of launches per backward pass
(issue 44, item 8): one norm per probed tensor cost GPT-2 small +31% on an H200 in the
debug preset. They keep their firing order and their verdicts when the kept gradients are
reduced in several blocks (a memory bound reached mid-backward)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from tracealyze.recorder import Recorder
from tracealyze.recorder.tensors import backward

from tests.recorder.test_backward_nan import BAD_FROM, Block, SqrtGate, _run, _tokens


class Deep(nn.Module):
    """48 Linear+GELU layers: ~100 probed tensors in a backward pass."""

    def __init__(self, depth: int = 48, d: int = 16) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(depth)
                                      for m in (nn.Linear(d, d), nn.GELU())])
        self.head = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x))


class Count:
    def __init__(self) -> None:
        self.n = 0


def _count_norm_calls(monkeypatch: pytest.MonkeyPatch) -> Count:
    """Counts the norm reductions the probes launch (each call is one or two kernels)."""
    c = Count()
    for mod, name in ((torch, "_foreach_norm"), (torch.linalg, "vector_norm")):
        real = getattr(mod, name)

        def counted(*a, _real=real, **k):
            c.n += 1
            return _real(*a, **k)

        monkeypatch.setattr(mod, name, counted)
    return c


def test_probes_take_a_bounded_number_of_reductions(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    model = Deep()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    with Recorder(tmp_path / "run", model=model, optimizer=opt, preset="debug",
                  profile_start=0, system_interval_s=0, grad_norm_every=0,
                  tensor_stats_every=0, param_stats_every=0, update_ratio_every=0,
                  activation_stats_every=0) as rec:
        for _ in range(3):  # (the first forward probes the structure)
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
        count = _count_norm_calls(monkeypatch)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        held_before = len(rec._life.acc.grad_probes)
        loss.backward()
        in_backward = count.n
        blocks = rec._life.acc.grad_probes[held_before:]
        opt.step()
        rec.step(loss=loss)
    probed = sum(len(labels) for labels, _ in blocks)
    assert probed >= 90, probed            # every layer's output gradient was probed ...
    assert in_backward <= 2, in_backward   # ... in one reduction (one dtype, one device)
    assert len(blocks) == 1 and blocks[0][1].shape == (probed,)


def test_the_memory_bound_splits_the_reduction_in_firing_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backward, "MAX_HELD", 7)
    model = Deep(depth=10)
    x = torch.randn(4, 16, requires_grad=False)

    class Acc:
        def __init__(self) -> None:
            self.grad_held: list = []
            self.grad_held_bytes = 0
            self.grad_probes: list = []

    acc = Acc()
    probes = backward.GradProbes(lambda: acc)
    outs = []

    def keep(mod, inp, out):
        probes.module_called(str(len(outs)), out, None)
        out.retain_grad()
        outs.append(out)

    handles = [m.register_forward_hook(keep) for m in model.layers]
    out = model(x)
    probes.forward_ended()
    out.sum().backward()
    for h in handles:
        h.remove()
    labels = sum((b[0] for b in acc.grad_probes), ())
    vec = torch.cat([b[1] for b in acc.grad_probes])
    assert len(acc.grad_probes) == 3 and len(labels) == 20  # 7 + 7 + 6
    # firing order: from the last layer back; each value is its tensor's gradient norm
    order = [int(lbl.split(":")[1].split("|")[0]) for lbl in labels]
    assert order == list(range(19, -1, -1))
    want = torch.stack([torch.linalg.vector_norm(outs[i].grad) for i in order])
    torch.testing.assert_close(vec, want)


def test_origin_is_found_when_the_reduction_is_split(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backward, "MAX_HELD", 2)
    f = _run(tmp_path / "run", Block(SqrtGate()), _tokens)
    assert f["evidence"].get("direction") == "backward", f
    assert f["subject"] == "bad" and f["first_step"] == BAD_FROM, f


def test_mixed_dtypes_reduce_per_dtype_in_firing_order() -> None:
    class Acc:
        def __init__(self) -> None:
            self.grad_held: list = []
            self.grad_held_bytes = 0
            self.grad_probes: list = []

    acc = Acc()
    grads = [torch.randn(5), torch.randn(3, dtype=torch.float64), torch.randn(4).bfloat16(),
             torch.randn(2)]
    acc.grad_held = [(f"out:{i}", g) for i, g in enumerate(grads)]
    backward.flush(acc)
    ((labels, vec),) = acc.grad_probes
    assert labels == ("out:0", "out:1", "out:2", "out:3") and vec.dtype == torch.float32
    want = torch.stack([torch.linalg.vector_norm(g.double()).float() for g in grads])
    torch.testing.assert_close(vec, want, rtol=1e-3, atol=1e-3)


def test_the_bytes_bound_is_a_share_of_a_gpu_and_a_floor_elsewhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Props:
        total_memory = 140 * 10**9

    monkeypatch.setattr(backward, "_held_limit", {})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: Props())
    # an H200: 2% of it, so GPT-2's 12-50 MB activation gradients take a flush or two
    assert backward.held_limit(torch.device("cuda", 0)) == int(140e9 * backward.DEVICE_SHARE)
    assert backward.held_limit(torch.device("cpu")) == backward.MAX_HELD_BYTES
    Props.total_memory = 1 << 30  # a small card: never below the floor
    monkeypatch.setattr(backward, "_held_limit", {})
    assert backward.held_limit(torch.device("cuda", 0)) == backward.MAX_HELD_BYTES


def test_the_bytes_bound_splits_the_reduction(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Deep(depth=6)
    x = torch.randn(8, 16)
    one = 8 * 16 * 4  # bytes of one layer output's gradient
    monkeypatch.setattr(backward, "_held_limit", {torch.device("cpu"): 5 * one})

    class Acc:
        def __init__(self) -> None:
            self.grad_held: list = []
            self.grad_held_bytes = 0
            self.grad_probes: list = []

    acc = Acc()
    probes = backward.GradProbes(lambda: acc)
    handles = [m.register_forward_hook(lambda m, i, o: probes.module_called("m", o, None))
               for m in model.layers]
    out = model(x)
    probes.forward_ended()
    out.sum().backward()
    for h in handles:
        h.remove()
    sizes = [len(b[0]) for b in acc.grad_probes]
    assert sum(sizes) == len(model.layers) and max(sizes) <= 5 and len(sizes) >= 2, sizes
