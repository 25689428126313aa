"""Reading a run while it is written (issue N18): the writer's compaction deletes parts a
reader listed; the reader lists again or reopens the run, and never fails or miscounts."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from tracealyze.analyzer.cli import main
from tracealyze.analyzer.run import catalog, footers
from tracealyze.analyzer.run.catalog import open_run
from tracealyze.format.parts import compact, rank_dir

from tests.runfactory import make_run

ROOT = str(Path(__file__).resolve().parents[2])


def _merge_all(run: Path) -> None:
    for table in ("steps", "memory", "metrics", "tensor_stats", "events"):
        d = rank_dir(run, table, 0)
        if d.is_dir():
            compact(d, table, final=True)


def test_a_part_merged_away_under_a_query_is_read_from_the_merge(tmp_path: Path) -> None:
    run = make_run(tmp_path, steps=60, parts=6, status="running")
    with open_run(run) as r:
        before = r.query("SELECT count(*), sum(step) FROM steps")[1]
        _merge_all(run)  # the views now name deleted files
        assert len(list(rank_dir(run, "steps", 0).iterdir())) == 1
        assert r.query("SELECT count(*), sum(step) FROM steps")[1] == before == [(60, 1770)]
        assert len(r.files["steps"]) == 1  # the reopened listing


def test_a_part_that_vanishes_while_listing_is_listed_again(tmp_path: Path,
                                                            monkeypatch) -> None:
    run = make_run(tmp_path, steps=40, parts=4, status="running")
    real = footers._footer
    calls = {"n": 0}

    def footer(path, *args):  # the merge lands right after the first footer read
        calls["n"] += 1
        if calls["n"] == 2:
            _merge_all(run)
        return real(path, *args)

    monkeypatch.setattr(footers, "_footer", footer)
    run_obj, valid = catalog.scan_run(run)
    assert run_obj.skipped_parts == []
    assert [p.name for p, _ in valid["steps"]] == [p.name for p in
                                                   rank_dir(run, "steps", 0).iterdir()]


WRITER = '''
import sys, time, torch
sys.path.insert(0, {root!r})
from tracealyze.recorder import Recorder
m = torch.nn.Linear(8, 2); o = torch.optim.SGD(m.parameters(), lr=0.01)
rec = Recorder({run!r}, model=m, optimizer=o, flush_interval_s=0.05,
               memory_every=1)
for step in range(100000):
    loss = m(torch.randn(4, 8)).pow(2).mean()
    o.zero_grad(); loss.backward(); o.step(); rec.step(loss=loss)
    if step == 50:
        print("READY", flush=True)
    time.sleep(0.002)
'''


@pytest.mark.slow
def test_analyzer_calls_on_a_live_run_never_fail(tmp_path: Path) -> None:
    run = tmp_path / "run"
    script = tmp_path / "w.py"
    script.write_text(WRITER.format(root=ROOT, run=str(run)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and "READY" in proc.stdout.readline()
        runner = CliRunner()
        failures = []
        counts = []
        end = time.time() + 12
        while time.time() < end:
            for args in (["summary", str(run), "--json"],
                         ["query", str(run), "SELECT count(*) AS n, max(step) AS m FROM steps",
                          "--format", "csv"]):
                res = runner.invoke(main, args)
                if res.exit_code not in (0, 1):
                    failures.append(res.output[-300:])
                elif args[0] == "query":
                    n, m = map(int, res.output.splitlines()[1].split(","))
                    counts.append((n, m))
        assert not failures, failures[:3]
        assert counts and all(n == m + 1 for n, m in counts), counts  # no step missed
    finally:
        proc.kill()
        proc.wait()


def test_a_multi_run_query_survives_a_merge_under_it(tmp_path: Path) -> None:
    from tracealyze.analyzer.run.multirun import open_runs

    a = make_run(tmp_path, name="a", steps=40, parts=4, status="running")
    b = make_run(tmp_path, name="b", steps=30, parts=3)
    with open_runs([a, b]) as rs:
        before = rs.query("SELECT count(*), sum(step) FROM steps")[1]
        _merge_all(a)
        assert rs.query("SELECT count(*), sum(step) FROM steps")[1] == before
        assert before == [(70, 780 + 435)]
