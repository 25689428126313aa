"""The report's profiler views per rank and step, memory from a real torch.profiler trace
(profile_memory=True), and the rank views of a job with many ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
from tracealyze.analyzer.gpu.memory import memory_timeline, top_allocating_ops
from tracealyze.analyzer.ingest.importer import import_traces
from tracealyze.analyzer.report.page import write_report
from tracealyze.analyzer.run.catalog import open_run

from tests.report.test_report import chart, data_of, page
from tests.runfactory import make_run

ROOT = Path(__file__).resolve().parents[2]
from multirank_jobs import assembled_job  # noqa: E402

MIB = 2**20


@pytest.fixture(scope="module")
def memory_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real CPU profile with allocator events: an MLP step that also keeps 4 MiB a step."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    out = tmp_path_factory.mktemp("prof")
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                 schedule=schedule(wait=0, warmup=1, active=3),
                 on_trace_ready=tensorboard_trace_handler(str(out), worker_name="rank0")) as p:
        for _ in range(4):
            model(torch.randn(32, 64)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            kept.append(torch.empty(MIB))  # 4 MiB of float32 a step, never freed
            p.step()
    return out


def test_memory_from_a_real_trace(memory_trace: Path, tmp_path: Path) -> None:
    import_traces([memory_trace], tmp_path / "run")
    with open_run(tmp_path / "run") as run:
        (series,) = memory_timeline(run.con)
        ops = top_allocating_ops(run.con)
    assert series["device"] == "cpu" and series["rank"] == 0
    assert series["peak_allocated"] >= 3 * 4 * MIB   # three profiled steps kept 4 MiB each
    allocated = [p[1] for p in series["points"]]
    assert allocated[-1] - allocated[0] >= 2 * 4 * MIB  # it grows over the profile
    top = ops[0]
    assert top["op"] == "aten::empty" and top["largest"] == 4 * MIB
    assert top["bytes"] >= 3 * 4 * MIB
    assert any(o["op"] in ("aten::addmm", "aten::mm") for o in ops)

    out = write_report(tmp_path / "run", tmp_path / "r.html", progress=False)
    text = page(out)
    mem = chart(text, "trace-memory")
    assert max(mem["figure"]["data"][0]["y"]) >= 12
    allocs = chart(text, "trace-allocs")
    assert allocs["figure"]["data"][0]["y"][-1].startswith("aten::empty")


def test_overview_and_rank_step_views(tmp_path: Path) -> None:
    job = assembled_job(tmp_path / "job", ranks=4, slow=[2])
    import_traces([job], tmp_path / "run", jobs=1)
    text = page(write_report(tmp_path / "run", tmp_path / "r.html", progress=False))
    ov = chart(text, "profiler-overview")
    names = {t["name"] for t in ov["figure"]["data"]}
    assert {"kernel", "communication", "CPU exec"} <= names
    assert ov["figure"]["data"][0]["x"] == ["551", "552"]
    heat = chart(text, "profiler-steps")["figure"]["data"][0]
    assert heat["y"] == [0, 1, 2, 3] and len(heat["z"][0]) == 2
    # the late rank waits least in its collectives, so its GPU idles most
    idle = {r: max(row) for r, row in zip(heat["y"], heat["z"], strict=True)}
    assert max(idle, key=idle.get) == 2


def test_many_ranks_are_drawn_as_distributions_with_the_outlier_named(tmp_path: Path) -> None:
    n = 40
    run = make_run(tmp_path, ranks=n, steps=60,
                   duration={r: (0.15 if r == 29 else 0.1) for r in range(n)})
    text = page(write_report(run, tmp_path / "r.html", progress=False))
    spread = chart(text, "ranks")
    assert [a["text"] for a in spread["figure"]["layout"]["annotations"]] == ["rank 29"]
    assert len(spread["figure"]["data"][0]["x"]) == n      # one dot per rank, no legend of n
    over = chart(text, "ranks-time")
    names = [t["name"] for t in over["figure"]["data"]]
    assert names[:5] == ["min", "max", "p5", "p95", "median"] and names[5:] == ["rank 29"]
    assert "rank 29 (150 ms, +50%)" in text  # the caption, in the page
    assert len(data_of(text)["charts"]) > 2
