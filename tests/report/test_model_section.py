"""The report's Model section on a real architecture (transformers' GPT-2 from a small config,
tied embeddings): the tree with the parameters under each module, the blocks where the
parameters split with their shares of parameters and gradient, the tied weight counted
once, a block frozen by mistake, and a buffer that grows (a running list kept in
``register_buffer``)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import torch
from torch import nn
from tracealyze.analyzer import open_run
from tracealyze.analyzer.report.context import ReportContext
from tracealyze.analyzer.report.model import model_section
from tracealyze.analyzer.report.page import write_report
from tracealyze.recorder import Recorder

transformers = pytest.importorskip("transformers")


class History(nn.Module):
    """Keeps every step's mean logit in a buffer: a buffer that grows one element a step."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(0))

    def note(self, x: torch.Tensor) -> None:
        self.seen = torch.cat([self.seen, x.detach().mean().reshape(1)])


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=2, vocab_size=96,
                                  n_positions=16)
    model = transformers.GPT2LMHeadModel(cfg)
    model.history = History()
    for p in model.transformer.h[0].parameters():  # frozen, yet in the optimizer
        p.requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run_dir = tmp_path_factory.mktemp("model") / "run"
    g = torch.Generator().manual_seed(0)
    with Recorder(run_dir, model=model, optimizer=opt, system_interval_s=0,
                  profile_start=0) as rec:
        for _ in range(130):
            ids = torch.randint(0, 96, (4, 12), generator=g)
            out = model(ids, labels=ids)
            model.history.note(out.logits)
            opt.zero_grad()
            out.loss.backward()
            opt.step()
            rec.step(loss=out.loss)
    return run_dir


def _tree_events(run: Path) -> list[dict]:
    t = ds.dataset(run / "events", partitioning="hive").to_table().to_pylist()
    return [json.loads(e["details"]) for e in t if e["kind"] == "model_tree"]


def test_the_tree_is_recorded_at_the_start_and_when_a_buffer_grows(run: Path) -> None:
    first, *later = _tree_events(run)
    assert later, "the growing buffer was not seen"
    names = [m["name"] for m in first["modules"]]
    assert names[0] == "" and "transformer.h.2.attn" in names
    assert first["shared"] == [{"param": "lm_head.weight", "same_as": "transformer.wte.weight",
                                "numel": 96 * 32}]
    model_params = sum(m["params"] for m in first["modules"])
    assert model_params == first["total_params"]  # the tied weight counted once
    assert first["optimizer_params"] == first["total_params"]
    assert first["trainable_params"] < first["total_params"]  # h.0 is frozen
    seen = {b["name"]: b["numel"] for b in later[-1]["buffers"]}
    assert seen["history.seen"] >= 100


def test_the_section_splits_where_the_parameters_do(run: Path) -> None:
    with open_run(run) as r:
        ctx = ReportContext(con=r.con, ranks=[0], rank=0)
        m = model_section(ctx)
    assert m is not None
    # GPT2LMHeadModel's transformer holds >= 90%: its children are the blocks
    assert m["blocks_of"] == "transformer"
    blocks = {b["name"]: b for b in m["blocks"]}
    assert set(blocks) == {"transformer.wte", "transformer.wpe", "transformer.h",
                           "transformer.ln_f"}
    assert sum(b["share"] for b in blocks.values()) == pytest.approx(1.0)
    assert sum(b["grad_share"] for b in blocks.values()) == pytest.approx(1.0, abs=1e-6)
    assert blocks["transformer.wte"]["params"] == 96 * 32
    h = next(n for n in m["root"]["children"][0]["children"] if n["name"] == "transformer.h")
    h0 = next(n for n in h["children"] if n["name"] == "transformer.h.0")
    assert h0["frozen"] and not h["frozen"]
    assert [g["name"] for g in m["grown"]] == ["history.seen"]
    assert m["grown"][0]["first"] == 0 and m["grown"][0]["last"] >= 100
    lm_head = next(n for n in m["root"]["children"] if n["name"] == "lm_head")
    assert lm_head["total"] == 0 and lm_head["aliased"] == 96 * 32


def test_the_page_shows_it(run: Path, tmp_path: Path) -> None:
    page = write_report(run, tmp_path / "r.html", progress=False).read_text()
    assert 'id="model-section"' in page and 'href="#model-section"' in page
    section = page.split('id="model-section"', 1)[1].split("</section>", 1)[0]
    for text in ("transformer.wte", "transformer.h", "<code>lm_head.weight</code>",
                 "history.seen", "frozen", "GPT2Block"):
        assert text in section, text


def test_a_hostile_model_tree_event_still_renders(tmp_path: Path) -> None:
    from tests.runfactory import make_run

    run_dir = make_run(tmp_path / "run", steps=40)
    hostile = {"modules": [{"name": "", "type": "<script>alert(1)</script>"},
                           {"name": "a", "params": float("inf")}, {"name": 5}, "junk",
                           {"name": "a.b", "params": "x", "dtype": "<b>"},
                           {"name": "c", "params": 7, "trainable": -3}],
               "shared": [{"param": "<img src=x>", "same_as": "a"}, 3],
               "buffers": "nope", "optimizer_params": "many", "total_params": None}
    import pyarrow as pa
    import pyarrow.parquet as pq

    events = run_dir / "events" / "rank=0"
    events.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({
        "step": pa.array([0], pa.int64()), "time": [1.0], "kind": ["model_tree"],
        "severity": ["info"], "subject": pa.array([None], pa.string()),
        "message": ["m"], "details": [json.dumps(hostile)],
        "stack": pa.array([None], pa.string())}), events / "part-999999.parquet")
    page = write_report(run_dir, tmp_path / "r.html", progress=False).read_text()
    section = page.split('id="model-section"', 1)[1].split("</section>", 1)[0]
    assert "<script>alert" not in section and "<img src=x>" not in section
    assert "&lt;img src=x&gt;" in section


def test_a_model_whose_tree_cannot_be_read_costs_only_a_line(tmp_path: Path) -> None:
    class Exotic(nn.Linear):
        """A wrapper written against an older nn.Module: its named_parameters takes no
        remove_duplicate (which the tree walk passes)."""

        def named_parameters(self, prefix: str = "", recurse: bool = True):  # type: ignore[override]
            return super().named_parameters(prefix=prefix, recurse=recurse)

    model = Exotic(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(tmp_path / "run", model=model, optimizer=opt, system_interval_s=0,
                  profile_start=0) as rec:
        for _ in range(3):
            loss = model(torch.randn(2, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
        assert rec.errors == 0
    (event,) = _tree_events(tmp_path / "run")
    assert "remove_duplicate" in event["error"] and "modules" not in event
    page = write_report(tmp_path / "run", tmp_path / "r.html", progress=False).read_text()
    assert 'id="model-section"' not in page
