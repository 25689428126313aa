"""Every parameter accounted for (#26): the recorder's param_coverage and model_structure
events, and the findings built on them (no_gradient, unused_module, optimizer_coverage,
vanishing_gradient's zero-by-construction info), on small models of the usual shapes."""

from __future__ import annotations

import json
import weakref

import pytest
import torch
from torch import nn
from tracealyze.recorder import Recorder

from tests.recorder.rec_helpers import events
from tests.scenarios import checks


def _train(tmp_path, model, opt, make_x, steps=30, **knobs):
    run = tmp_path / "run"
    with Recorder(run, model=model, optimizer=opt, profile_start=0, **knobs) as rec:
        for _ in range(steps):
            loss = model(make_x()).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            rec.step(loss=loss.detach())
    return run


class CutMLP(nn.Module):
    """An MLP whose second layer's output is detached by mistake (the graph-cut bug)."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2, self.l3, self.head = (nn.Linear(8, 16), nn.Linear(16, 16),
                                                 nn.Linear(16, 16), nn.Linear(16, 2))

    def forward(self, x):
        h = torch.relu(self.l2(torch.relu(self.l1(x)))).detach()
        return self.head(torch.relu(self.l3(h)))


def test_graph_cut_by_detach_is_a_no_gradient_warning(tmp_path):
    torch.manual_seed(0)
    m = CutMLP()
    run = _train(tmp_path, m, torch.optim.Adam(m.parameters(), 1e-3), lambda: torch.randn(8, 8))
    (ev,) = [e for e in events(run, "param_coverage")]
    d = json.loads(ev["details"])
    assert sorted(d["no_grad"]) == ["l1.bias", "l1.weight", "l2.bias", "l2.weight"]
    assert d["with_grad"] == 4 and d["optimizer_known"] is True
    s = checks.summarize(run)
    (f,) = checks.by_id(s, "no_gradient")
    assert f["severity"] == "warning" and f["subject"] == "l1"
    assert f["evidence"]["modules"] == ["l1", "l2"] and f["evidence"]["count"] == 4
    assert not checks.by_id(s, "unused_module")


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.aux_head = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))  # never called
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.body(self.frozen(x))


def test_unused_branch_and_frozen_block(tmp_path):
    m = Branchy()
    # the frozen block is left out of the optimizer: a freeze on purpose (info)
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.01)
    run = _train(tmp_path, m, opt, lambda: torch.randn(4, 4))
    s = checks.summarize(run)
    (u,) = checks.by_id(s, "unused_module")
    assert u["severity"] == "warning" and u["subject"] == "aux_head"
    assert not checks.by_id(s, "no_gradient")
    (info,) = checks.by_id(s, "frozen_module")
    assert info["severity"] == "info"
    assert info["subject"] == "frozen" and "frozen" in info["title"]
    assert not checks.by_id(s, "optimizer_coverage")


def test_block_frozen_by_mistake_is_in_the_optimizer(tmp_path):
    m = Branchy()
    del m.aux_head
    run = _train(tmp_path, m, torch.optim.SGD(m.parameters(), lr=0.01),
                 lambda: torch.randn(4, 4))
    (f,) = checks.by_id(checks.summarize(run), "optimizer_coverage")
    assert f["severity"] == "warning" and f["subject"] == "frozen"


@pytest.mark.parametrize("other_optimizer", [False, True])
def test_parameters_left_out_of_the_optimizer(tmp_path, other_optimizer):
    """A head added after the optimizer was built: an error when its weights never move;
    nothing when a second optimizer steps them (a GAN's discriminator)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(m[0].parameters(), lr=0.05)
    other = torch.optim.SGD(m[2].parameters(), lr=0.05)
    run = tmp_path / "run"
    with Recorder(run, model=m, optimizer=opt, profile_start=0, param_stats_every=5) as rec:
        for _ in range(30):
            loss = m(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            other.zero_grad()
            loss.backward()
            opt.step()
            if other_optimizer:
                other.step()
            rec.step(loss=loss.detach())
    found = checks.by_id(checks.summarize(run), "optimizer_coverage")
    if other_optimizer:
        assert found == []
    else:
        (f,) = found
        assert f["severity"] == "error" and f["subject"] == "2"
        assert f["evidence"]["unchanged"] == 2


def test_an_optimizer_bound_to_a_discarded_model_at_a_resume(tmp_path):
    """A relaunch that loads the checkpoint into a NEW module after building the optimizer
    on the first one: from the resume nothing trains. The weights moved before it (the
    first process's training), so only the steps from the resume tell; dated there."""
    torch.manual_seed(0)
    run = tmp_path / "run"

    def train(m, opt, steps, **kw):
        with Recorder(run, model=m, optimizer=opt, profile_start=0, param_stats_every=5,
                      **kw) as rec:
            for i in steps:
                loss = m(torch.randn(8, 4)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                rec.step(loss=loss.detach(), step=i)

    def build():
        m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        return m, torch.optim.SGD(m.parameters(), lr=0.05)

    m, opt = build()
    train(m, opt, range(30))
    state = m.state_dict()
    _, opt = build()                      # the optimizer of the relaunch ...
    m = build()[0]                        # ... and the module the checkpoint went into
    m.load_state_dict(state)
    train(m, opt, range(30, 60), resume=True)
    (f,) = checks.by_id(checks.summarize(run), "optimizer_coverage")
    assert f["severity"] == "error" and f["first_step"] == 30
    assert f["evidence"]["unchanged"] == 4


def test_a_block_unfrozen_mid_run_and_left_out_of_the_optimizer(tmp_path):
    """Fine-tuning that unfreezes the encoder at step 20 without adding it to the
    optimizer: it is outside from 20 (at step 0 it was frozen, which was meant)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    m[0].requires_grad_(False)
    opt = torch.optim.SGD(m[2].parameters(), lr=0.05)
    run = tmp_path / "run"
    with Recorder(run, model=m, optimizer=opt, profile_start=0, param_stats_every=5) as rec:
        for i in range(50):
            if i == 20:
                m[0].requires_grad_(True)
            loss = m(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss.detach())
    (f,) = checks.by_id(checks.summarize(run), "optimizer_coverage")
    assert f["severity"] == "error" and f["first_step"] == 20 and f["subject"] == "0"


class ConvBN(nn.Module):
    """The common CNN block: Conv2d(bias=True) straight into BatchNorm2d."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=True)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=True)  # ReLU in between: not zero
        self.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        h = self.bn2(torch.relu(self.conv2(h)))
        return self.fc(h.mean((2, 3)))


def test_bias_before_batchnorm_is_zero_by_construction(tmp_path):
    torch.manual_seed(0)
    m = ConvBN()
    run = _train(tmp_path, m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
                 lambda: torch.randn(8, 3, 8, 8), steps=60)
    (ev,) = events(run, "model_structure")
    d = json.loads(ev["details"])
    assert [z["param"] for z in d["zero_by_construction"]] == ["conv1.bias"]
    assert d["zero_by_construction"][0]["consumer"] == "bn1" and d["not_called"] == []
    s = checks.summarize(run)
    assert not checks.above(s, "info"), checks.describe(s)
    (v,) = checks.by_id(s, "vanishing_gradient")
    assert v["severity"] == "info" and v["subject"] == "conv1.bias"
    assert "BatchNorm2d" in v["message"]


def _ours(modules) -> int:
    """The recorder's hooks on these modules (tensors/modhooks.py keeps them outside)."""
    from tracealyze.recorder.tensors import modhooks

    ids = {id(x) for x in modules}
    return sum(len(v) for t in (modhooks._pre, modhooks._post) for k, v in t.items()
               if k in ids)


def test_structure_probe_skips_eval_passes_and_removes_its_hooks(tmp_path):
    m = ConvBN()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    with Recorder(tmp_path / "run", model=m, optimizer=opt, profile_start=0) as rec:
        m.eval()
        with torch.no_grad():
            m(torch.randn(2, 3, 8, 8))  # a sanity check before training: not read
        m.train()
        hooks = _ours(m.modules())
        loss = m(torch.randn(2, 3, 8, 8)).sum()
        after = _ours(m.modules())
        # (hooked from outside: the modules' own hook tables stay empty throughout)
        assert not any(x._forward_pre_hooks or x._forward_hooks for x in m.modules())
        loss.backward()
        opt.step()
        rec.step(loss=loss.detach())
    assert hooks > 0 and after == 0
    (ev,) = events(tmp_path / "run", "model_structure")
    assert "conv1.bias" in ev["details"]


def test_structure_probe_of_a_model_the_loop_never_calls(tmp_path):
    """A LightningModule-like wrapper: the loop calls its submodule, never the wrapper itself.
    The probe still reads the first training pass, and its hooks go at the first step's end
    (they were left on every module for the whole run, and no event was written)."""
    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = ConvBN()

    w = Wrapper()
    opt = torch.optim.SGD(w.parameters(), lr=0.01)

    def hooks() -> int:  # on the submodules (the FLOP counter's own is on the root)
        return _ours(x for x in w.modules() if x is not w)

    seen: list[weakref.ref] = []
    # (a global hook of the test's own: the counts above are the recorder's)
    mine = torch.nn.modules.module.register_module_forward_hook(
        lambda m, _a, out: seen.append(weakref.ref(out)) if m is w.net.conv1 else None)
    with Recorder(tmp_path / "run", model=w, optimizer=opt, profile_start=0) as rec:
        counts, alive = [], []
        for _ in range(3):
            loss = w.net(torch.randn(2, 3, 8, 8)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            value = loss.detach()
            del loss
            # the pass lasts until the step ends, but holds no module output alive
            alive.append(seen[-1]() is not None)
            rec.step(loss=value)
            counts.append(hooks())
    mine.remove()
    assert counts == [0, 0, 0] and alive == [False, False, False]
    (ev,) = events(tmp_path / "run", "model_structure")
    d = json.loads(ev["details"])
    assert [z["param"] for z in d["zero_by_construction"]] == ["net.conv1.bias"]
    assert d["not_called"] == []


def test_a_block_frozen_by_mistake_is_the_root_cause_of_the_plateau(tmp_path):
    """Everything that could learn is frozen (yet handed to the optimizer): the loss cannot
    fall, and the summary says why first."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    m.requires_grad_(False)
    m[2].bias.requires_grad_(True)  # (one scalar still trains: backward runs)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    run = tmp_path / "run"
    opt = torch.optim.SGD(m.parameters(), lr=1e-4)
    with Recorder(run, model=m, optimizer=opt, profile_start=0) as rec:
        for i in range(120):
            idx = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
            loss = (m(x[idx]) - y[idx]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss.detach())
    s = checks.summarize(run)
    top = s["findings"][0]
    assert top["id"] == "optimizer_coverage", checks.describe(s)
    plateau = checks.by_id(s, "loss_plateau")
    assert plateau and plateau[0]["severity"] == "warning"
    assert plateau[0]["caused_by"] == "optimizer_coverage"
