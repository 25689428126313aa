"""tracealyze fleet: every run under the roots found and analysed as summary analyses it,
kept in an incremental index (only new or changed runs analysed again, deleted runs
dropped, concurrent commands merged), bad hosts named across runs, and the index queried
with query --fleet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from cli_helpers import bad
from click.testing import CliRunner
from tracealyze.analyzer.cli import main
from tracealyze.analyzer.diagnosis.findings import severity_rank
from tracealyze.analyzer.diagnosis.summary import build_summary
from tracealyze.analyzer.fleet.fleet import needs_analysis, run_fleet
from tracealyze.analyzer.fleet.hosts import tail_p

from tests.fleetfactory import FleetSpec, make_fleet
from tests.runfactory import make_run, write_part, write_run_json

CLI = [sys.executable, "-c", "from tracealyze.analyzer.cli import main; main()"]


def cli(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


def small_fleet(root: Path) -> dict[str, Path]:
    """Runs at several depths, one crashed, one leaking, one killed, one healthy; a folder
    that is not a run; a run inside a run's folder is not searched for."""
    runs = {
        "healthy": make_run(root / "a" / "b", name="healthy", steps=150, seed=1),
        "leak": make_run(root / "a", name="leak", steps=200, seed=2,
                         rss=lambda s: 1e9 + 3e6 * s),
        "crashed": make_run(root, name="crashed", steps=80, seed=3, status="crashed",
                            events=[{"kind": "exception", "severity": "critical",
                                     "step": 79, "message": "RuntimeError: boom"}]),
        "killed": make_run(root / "c" / "d" / "e", name="killed", steps=90, seed=4,
                           status="running", heartbeat_age_s=3600),
    }
    (root / "logs").mkdir()
    (root / "logs" / "train.log").write_text("not a run")
    return runs


def test_every_run_at_any_depth_with_the_summarys_findings(tmp_path: Path) -> None:
    runs = small_fleet(tmp_path / "fleet")
    result = run_fleet([tmp_path / "fleet"], jobs=1)
    by_path = {r["path"]: r for r in result.runs}
    assert set(by_path) == {str(p) for p in runs.values()}
    assert by_path[str(runs["crashed"])]["status"] == "crashed"
    assert by_path[str(runs["killed"])]["status"] == "killed"
    assert by_path[str(runs["leak"])]["top_finding"] == "memory_leak"
    for path, row in by_path.items():
        s = build_summary(path)
        sev = [f["severity"] for f in s["findings"]]
        for level in ("info", "warning", "error", "critical"):
            assert row[f"n_{level}"] == sev.count(level), (path, level)
        above = [f for f in s["findings"] if f["severity"] != "info"]
        want = max(above, key=lambda f: severity_rank(f["severity"]), default=None)
        assert row["top_finding"] == (want["id"] if want else None)
        assert row["steps"] == s["run"]["steps"] and row["run_id"] == s["run"]["run_id"]
    # worst first: the crashed (critical) run leads, the healthy one is last
    assert result.runs[0]["path"] == str(runs["crashed"])
    assert result.runs[-1]["path"] == str(runs["healthy"])
    # the index is plain Parquet, run_id a real column
    t = pq.read_table(result.index / "runs" / "data.parquet")
    assert sorted(t.column("run_id").to_pylist()) == sorted(r["run_id"] for r in result.runs)


def test_a_second_fleet_analyses_only_what_changed(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    runs = small_fleet(root)
    first = run_fleet([root], jobs=1)
    assert (first.analysed, first.reused) == (4, 0)
    index_file = first.index / "runs" / "data.parquet"
    written = index_file.stat().st_mtime_ns
    again = run_fleet([root], jobs=1)
    assert (again.analysed, again.reused, again.removed) == (0, 4, 0)
    assert index_file.stat().st_mtime_ns == written  # current: nothing rewritten
    # a new run, a run that got a new part, a run deleted
    make_run(root, name="new", steps=60, seed=9)
    write_part(runs["healthy"], "metrics", 0, [{"step": 1, "name": "acc", "value": 0.5}], 7)
    import shutil

    shutil.rmtree(runs["leak"])
    third = run_fleet([root], jobs=1)
    assert (third.analysed, third.reused, third.removed) == (2, 2, 1)
    paths = {r["path"] for r in third.runs}
    assert str(runs["leak"]) not in paths and str(root / "new") in paths
    stored = pq.read_table(index_file).column("path").to_pylist()
    assert str(runs["leak"]) not in stored  # no row for a run that no longer exists
    assert not [p for p in pq.read_table(first.index / "findings" / "data.parquet")
                .column("path").to_pylist() if p == str(runs["leak"])]


def test_a_running_run_is_analysed_again_when_its_heartbeat_moves_or_goes_stale(
        tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    run = make_run(root, name="live", steps=50, status="running")
    first = run_fleet([root], jobs=1)
    assert first.runs[0]["status"] == "running"
    # a heartbeat: the rank file is rewritten, the run is analysed again
    rank_file = run / "ranks" / "rank=0.json"
    meta = json.loads(rank_file.read_text())
    meta["heartbeat"] += 5
    rank_file.write_text(json.dumps(meta))
    assert run_fleet([root], jobs=1).analysed == 1
    # no file changed, but the heartbeat is now stale: killed
    row = dict(first.runs[0])
    from tracealyze.analyzer.fleet.discover import discover

    (ref,) = discover([root])
    row.update(fingerprint=ref.fingerprint, analyzer=row["analyzer"])
    now = row["heartbeat"] + row["stale_after_s"] + 1
    assert needs_analysis(row, ref, row["analyzer"], now)
    assert not needs_analysis(row, ref, row["analyzer"], row["heartbeat"] + 1)
    assert needs_analysis(row, ref, "another-version", row["heartbeat"] + 1)


def test_concurrent_fleet_commands_on_one_index_lose_nothing(tmp_path: Path) -> None:
    for side in ("east", "west"):
        for i in range(6):
            make_run(tmp_path / side, name=f"r{i}", steps=60, seed=i)
    index = tmp_path / "shared-index"
    procs = [subprocess.Popen([*CLI, "fleet", str(tmp_path / side), "--index", str(index),
                               "--jobs", "1", "--json", "-q"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for side in ("east", "west")]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    rows = pq.read_table(index / "runs" / "data.parquet").to_pylist()
    paths = sorted(r["path"] for r in rows)
    want = sorted(str(tmp_path / side / f"r{i}") for side in ("east", "west") for i in range(6))
    assert paths == want  # both commands' rows, each once
    assert not list(index.rglob("*.tmp"))


def test_tail_p_is_the_binomial_tail_when_the_chances_are_equal() -> None:
    from math import comb

    for n, p in ((10, 0.25), (30, 0.5), (7, 0.1)):
        for k in range(n + 1):
            want = sum(comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1))
            assert tail_p([p] * n, k) == pytest.approx(want, rel=1e-9, abs=1e-15)
    rng = np.random.default_rng(0)  # against simulation for unequal chances
    probs = rng.uniform(0.05, 0.6, 20)
    sims = (rng.random((200_000, 20)) < probs).sum(axis=1)
    assert tail_p(probs, 8) == pytest.approx(float(np.mean(sims >= 8)), abs=0.005)


SMALL = {"min_steps": 80, "max_steps": 200, "min_tensors": 2, "max_tensors": 6,
         "tensor_every": 20, "rank_choices": (2, 4, 8), "rank_weights": (1, 1, 1),
         "hosts": 10, "pathology_share": 0.0}


def test_suspect_host_names_the_slow_host_and_no_other(tmp_path: Path) -> None:
    spec = make_fleet(tmp_path / "fleet", FleetSpec(runs=36, slow_hosts=("node-004",),
                                                    seed=3, **SMALL))
    result = run_fleet([tmp_path / "fleet"], jobs=2)
    hosts = [f["subject"] for f in result.fleet_findings]
    assert hosts == ["node-004"], result.fleet_findings
    (f,) = result.fleet_findings
    ev = f["evidence"]
    assert f["id"] == "suspect_host" and f["severity"] == "warning"
    assert ev["slow_runs"] >= 3 and ev["rate"] >= 2 * ev["peers_rate"]
    assert 0.2 < ev["median_slowdown"] < 0.45  # the 30% it was made slower
    multi = [m for m in spec.made if "node-004" in m["hosts"] and len(m["hosts"]) > 1]
    assert ev["runs"] == len(multi)


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_a_fleet_of_alike_hosts_has_no_suspect(tmp_path: Path, seed: int) -> None:
    make_fleet(tmp_path / "fleet", FleetSpec(runs=36, slow_hosts=(), seed=seed, **SMALL))
    assert run_fleet([tmp_path / "fleet"], jobs=2).fleet_findings == []


def test_the_cli_text_json_page_and_gate(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    small_fleet(root)
    res = cli("fleet", root, "--json", "--jobs", "1")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["schema_version"] == 1 and len(out["runs"]) == 4
    assert {"run_id", "path", "status", "started", "duration_s", "steps", "world_size",
            "hosts", "model_class", "model_parameters", "throughput_steps_per_s",
            "peak_rss_bytes", "top_finding", "top_severity", "top_subject",
            "top_first_step", "n_warning", "n_error", "n_critical"} <= set(out["runs"][0])
    assert cli("fleet", root, "--fail-on", "critical").exit_code == 1  # the crash
    text = cli("fleet", root).stdout
    assert "4 runs" in text and "crashed" in text and "memory_leak" in text
    page = tmp_path / "site" / "fleet.html"
    res = cli("fleet", root, "-o", page, "--reports")
    assert res.exit_code == 0, res.output
    html = page.read_text()
    reports = sorted((tmp_path / "site" / "fleet-reports").glob("*.html"))
    assert len(reports) == 4
    for r in reports:
        assert f'href="fleet-reports/{r.name}"' in html
    assert "Runs started per day" in html and 'id="runs-table"' in html


def test_reports_need_a_page_and_bad_roots_are_one_line(tmp_path: Path) -> None:
    small_fleet(tmp_path / "fleet")
    assert "give -o" in bad(cli("fleet", tmp_path / "fleet", "--reports"))
    assert "no such directory" in bad(cli("fleet", tmp_path / "nope"))
    assert "no fleet index" in bad(cli("query", "--fleet", tmp_path / "fleet", "SELECT 1"))


def test_an_unreadable_run_is_a_row_not_a_failure(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    make_run(root, name="fine", steps=60)
    broken = root / "broken"
    broken.mkdir()
    (broken / "run.json").write_text("{ not json")
    result = run_fleet([root], jobs=1)
    rows = {Path(r["path"]).name: r for r in result.runs}
    assert rows["broken"]["status"] == "unreadable" and rows["broken"]["error"]
    assert rows["fine"]["status"] == "completed"
    assert result.runs[0]["path"] == str(broken)  # worst first
    assert cli("fleet", root, "--fail-on", "error").exit_code == 1


def test_query_fleet_views_and_pruning_by_runs(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    runs = small_fleet(root)
    run_fleet([root], jobs=1)
    res = cli("query", "--fleet", root, "SELECT status, count(*) AS n FROM runs GROUP BY 1 "
              "ORDER BY 1", "--format", "json")
    assert res.exit_code == 0, res.output
    assert {r["status"]: r["n"] for r in json.loads(res.stdout)} == {
        "completed": 2, "crashed": 1, "killed": 1}
    res = cli("query", "--fleet", root, "SELECT DISTINCT id FROM findings WHERE "
              "severity <> 'info' ORDER BY 1", "--format", "csv")
    assert "memory_leak" in res.stdout and "training_crashed" in res.stdout
    # run tables across the fleet, with run_id; --runs prunes the runs scanned
    sql = "SELECT run_path, count(*) AS n FROM steps GROUP BY 1 ORDER BY 1"
    every = json.loads(cli("query", "--fleet", root, sql, "--format", "json").stdout)
    assert {r["run_path"]: r["n"] for r in every} == {
        str(runs["healthy"]): 150, str(runs["leak"]): 200, str(runs["crashed"]): 80,
        str(runs["killed"]): 90}
    some = json.loads(cli("query", "--fleet", root, sql, "--format", "json", "--runs",
                          "status = 'crashed'").stdout)
    assert [r["run_path"] for r in some] == [str(runs["crashed"])]
    none = json.loads(cli("query", "--fleet", root, sql, "--format", "json", "--runs",
                          "FALSE").stdout)
    assert none == []
    joined = cli("query", "--fleet", root, "SELECT r.status, max(s.step) AS last FROM runs r "
                 "JOIN steps s ON s.run_path = r.path GROUP BY 1 ORDER BY 1", "--format", "csv")
    assert joined.exit_code == 0 and "crashed,79" in joined.stdout
    assert "--runs" in bad(cli("query", "--fleet", root, sql, "--runs", "nope = 1"))
    assert "--runs" in bad(cli("query", "--fleet", root, sql, "--runs", "TRUE; SELECT 1"))


def test_hostile_run_folder_names_stay_data(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    for name in ("a'; DROP TABLE runs; --", 'q"uote', "{rank}", "semi;colon"):
        make_run(root, name=name, steps=40)
    result = run_fleet([root], jobs=1)
    assert len(result.runs) == 4 and all(r["status"] == "completed" for r in result.runs)
    res = cli("query", "--fleet", root, "SELECT run_path, count(*) FROM steps GROUP BY 1",
              "--format", "json")
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.stdout)) == 4
    page = tmp_path / "fleet.html"
    assert cli("fleet", root, "-o", page, "--reports").exit_code == 0
    for f in (tmp_path / "fleet-reports").iterdir():
        assert f.parent == tmp_path / "fleet-reports" and f.suffix == ".html"
    assert "<script>alert" not in page.read_text()


def test_a_run_json_written_by_hand_is_a_run(tmp_path: Path) -> None:
    # the fleet takes what the format says, not what our factory writes
    root = tmp_path / "fleet"
    write_run_json(root / "bare", status="completed")
    result = run_fleet([root], jobs=1)
    assert [Path(r["path"]).name for r in result.runs] == ["bare"]
    assert result.runs[0]["status"] == "completed" and result.runs[0]["steps"] == 0


def test_the_fleet_json_is_stable_for_the_ci_gate(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    small_fleet(root)
    a = json.loads(cli("fleet", root, "--json").stdout)
    b = json.loads(cli("fleet", root, "--json").stdout)
    strip = ("analysed", "reused")
    assert {k: v for k, v in a.items() if k not in strip} == \
        {k: v for k, v in b.items() if k not in strip}
    assert (a["analysed"], b["analysed"]) == (4, 0)
    assert os.path.isdir(a["index"])


def _rank_rows(rng: np.random.Generator, runs: int, hosts: int,
               slow: dict[str, float]) -> list[dict]:
    """Index ``ranks`` rows of ``runs`` multi-host jobs (2-16 ranks, 1-8 a host), compute
    times with 3% noise, hosts in ``slow`` that much slower."""
    rows = []
    for i in range(runs):
        w = int(rng.choice([2, 4, 8, 16]))
        per = int(rng.choice([p for p in (1, 2, 4, 8) if p <= w]))
        chosen = rng.choice(hosts, size=max(1, w // per), replace=False)
        for r in range(w):
            h = f"h{int(chosen[min(r // per, len(chosen) - 1)]):02d}"
            t = 0.1 * (1 + 0.03 * abs(rng.normal())) * (1 + slow.get(h, 0.0))
            rows.append({"path": f"/runs/{i}", "run_id": str(i), "rank": r, "host": h,
                         "median_step_s": t, "median_compute_s": t, "straggler": False})
    return rows


@pytest.mark.parametrize("seed", range(20))
def test_suspect_host_has_no_false_alarm_on_alike_hosts(seed: int) -> None:
    from tracealyze.analyzer.fleet.hosts import suspect_hosts

    rng = np.random.default_rng(seed)
    assert suspect_hosts(_rank_rows(rng, runs=400, hosts=24, slow={})) == []


@pytest.mark.parametrize("seed", range(5))
def test_suspect_host_finds_a_host_10_percent_slow_among_24(seed: int) -> None:
    from tracealyze.analyzer.fleet.hosts import suspect_hosts

    rng = np.random.default_rng(100 + seed)
    found = suspect_hosts(_rank_rows(rng, runs=400, hosts=24, slow={"h05": 0.10}))
    assert [f["subject"] for f in found] == ["h05"]
