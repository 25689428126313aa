"""import-trace of a directory of per-rank traces, how a trace's rank is found, and the
trace-based straggler (late at its collectives), alone and joined with the recorder's
per-rank step times."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from tracealyze.analyzer.cli import main
from tracealyze.analyzer.diagnosis.summary import build_summary
from tracealyze.analyzer.errors import TraceError
from tracealyze.analyzer.gpu.stragglers import collective_lateness, trace_stragglers
from tracealyze.analyzer.ingest.importer import import_traces
from tracealyze.analyzer.ingest.ranks import rank_in_name, trace_files
from tracealyze.analyzer.ingest.read import read_trace
from tracealyze.analyzer.run.catalog import open_run

ROOT = Path(__file__).resolve().parents[2]
from multirank_jobs import assembled_job, synthetic_job  # noqa: E402

from tests.runfactory import make_run  # noqa: E402


@pytest.mark.parametrize(("name", "rank"), [
    ("rank3.pt.trace.json", 3), ("trainer_rank_12.json.gz", 12), ("x-rank-7.json", 7),
    ("worker_5.1700000000.pt.trace.json", 5), ("Worker2.json", 2), ("host1.json", None),
    ("frank3.json", None), ("cpu_only_rank34.pt.trace.json.gz", 34),
])
def test_rank_in_file_name(name: str, rank: int | None) -> None:
    assert rank_in_name(Path(name)) == rank


def test_distributed_info_before_the_events_names_the_rank(write_trace) -> None:
    # torch writes distributedInfo at the top, before traceEvents (a nested object there was
    # once lost, making every rank 0)
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 1}]
    p = write_trace(ev, name="worker_9.json",
                    distributedInfo={"backend": "nccl", "rank": 6, "world_size": 8})
    assert set(read_trace(p).column("rank").to_pylist()) == {6}   # wins over the name
    q = write_trace(ev, name="worker_9b.json")
    assert set(read_trace(q).column("rank").to_pylist()) == {9}   # else the file name


def test_trace_files_expands_directories(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / ".hidden").mkdir()
    for rel in ("d/a.pt.trace.json", "d/sub/b.json.gz", "d/.hidden/c.json", "d/notes.txt"):
        (tmp_path / rel).write_text('{"traceEvents": []}')
    files = trace_files([tmp_path / "d", tmp_path / "d" / "a.pt.trace.json"])
    assert [f.relative_to(tmp_path).as_posix() for f in files] == [
        "d/a.pt.trace.json", "d/sub/b.json.gz"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match="holds no trace files"):
        trace_files([tmp_path / "empty"])
    with pytest.raises(TraceError, match="no such file"):
        trace_files([tmp_path / "missing.json"])


@pytest.fixture(scope="module")
def assembled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("jobs")
    return {"slow": assembled_job(root / "slow", ranks=8, slow=[5]),
            "healthy": assembled_job(root / "healthy", ranks=8)}


def test_import_a_directory_of_ranks_in_parallel(assembled, tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["import-trace", "-j", "2", str(assembled["slow"]),
                                    str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    assert "8 traces, 8 ranks" in res.output
    assert res.stderr.count("read ") == 8          # progress, one line per trace
    with open_run(tmp_path / "run") as run:
        assert list(run.ranks) == list(range(8))
        assert run.con.execute("SELECT count(DISTINCT rank) FROM trace_events").fetchone()[0] == 8
    # importing it again writes nothing twice
    again = import_traces([assembled["slow"]], tmp_path / "run", jobs=2)
    assert all(r["skipped"] for r in again)


def test_a_bad_trace_in_the_directory_imports_nothing(assembled, tmp_path: Path) -> None:
    d = tmp_path / "ranks"
    d.mkdir()
    for p in sorted(assembled["healthy"].iterdir())[:3]:
        (d / p.name).write_bytes(p.read_bytes())
    (d / "rank9.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "na'))
    res = CliRunner().invoke(main, ["import-trace", "-j", "2", str(d), str(tmp_path / "run")])
    assert res.exit_code == 2 and "rank9.json.gz" in res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "run" / "trace_events").exists()


def _straggler(run_dir: Path) -> list[dict]:
    return [f for f in build_summary(run_dir)["findings"] if f["id"] == "straggler"]


def test_the_late_rank_is_named_and_a_healthy_job_is_quiet(assembled, tmp_path: Path) -> None:
    import_traces([assembled["slow"]], tmp_path / "slow", jobs=2)
    (f,) = _straggler(tmp_path / "slow")
    assert f["subject"] == "rank 5" and f["severity"] == "warning"
    assert f["evidence"]["trace"]["median_late_share"] == pytest.approx(0.16, abs=0.02)
    import_traces([assembled["healthy"]], tmp_path / "healthy", jobs=2)
    assert _straggler(tmp_path / "healthy") == []


def test_lateness_survives_clock_offsets_between_hosts(tmp_path: Path) -> None:
    # each rank's clock is up to 5 s off; lateness is read from durations, not start times
    synthetic_job(tmp_path / "t", ranks=6, steps=3, kernels=10, slow=[2, 4], slowdown=0.6)
    import_traces([tmp_path / "t"], tmp_path / "run", jobs=1)
    with open_run(tmp_path / "run") as run:
        rows = collective_lateness(run.con)
    assert {r["rank"] for r in rows} == set(range(6)) and {r["step"] for r in rows} == {1, 2, 3}
    named = [s["rank"] for s in trace_stragglers(rows)]
    assert sorted(named) == [2, 4]


def test_joined_with_the_recorders_step_times(assembled, tmp_path: Path) -> None:
    # the recorder saw rank 5 compute 40% longer; its traces say it is late at collectives
    run = make_run(tmp_path, ranks=8, steps=60,
                   duration={r: (0.14 if r == 5 else 0.1) for r in range(8)})
    import_traces([assembled["slow"]], run, jobs=2)
    (f,) = _straggler(run)
    assert f["subject"] == "rank 5" and f["evidence"]["metric"] != "collective lateness (traces)"
    assert f["evidence"]["trace"]["rank"] == 5 and "profiler traces agree" in f["message"]


def test_every_rank_has_its_gpu_time_in_the_summary(assembled, tmp_path: Path) -> None:
    import_traces([assembled["slow"]], tmp_path / "run", jobs=2)
    gpu = build_summary(tmp_path / "run")["gpu_time"]
    assert [g["rank"] for g in gpu] == list(range(8))
    assert all(len(g["steps"]) == 2 and g["comm_comp_overlap_pct"] is not None for g in gpu)
    # the late rank waits least in its collectives: the least non-compute time
    assert min(gpu, key=lambda g: g["non_compute_us"])["rank"] == 5
    json.dumps(gpu)  # plain JSON


def test_views_over_many_ranks_keep_each_rows_rank(tmp_path: Path) -> None:
    # past MANY_RANKS the views are one scan with the rank joined in by file name
    from tracealyze.analyzer.run.held import MANY_RANKS

    n = MANY_RANKS + 4
    run = make_run(tmp_path, ranks=n, steps=30,
                   duration={r: 0.1 + 0.001 * r for r in range(n)}, parts=2)
    with open_run(run) as opened:
        rows = opened.con.execute(
            "SELECT rank, count(*), min(duration_s) FROM steps GROUP BY rank ORDER BY rank"
        ).fetchall()
    assert [r[0] for r in rows] == list(range(n))
    assert all(c == 30 for _, c, _ in rows)
    assert [round(d, 4) for _, _, d in rows] == [round(0.1 + 0.001 * r, 4) for r in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9])
def test_median_of_others_equals_deleting_each_row(n: int) -> None:
    import numpy as np
    from tracealyze.analyzer.diagnosis.detectors.straggler import median_of_others

    m = np.random.default_rng(n).normal(size=(n, 11))
    m[0, 0] = m[1, 0]  # ties
    ref = np.stack([np.median(np.delete(m, i, axis=0), axis=0) for i in range(n)])
    assert np.allclose(median_of_others(m), ref)


def test_json_files_in_a_directory_that_are_not_traces_are_skipped(assembled,
                                                                   tmp_path: Path) -> None:
    d = tmp_path / "prof"
    d.mkdir()
    src = sorted(assembled["healthy"].iterdir())[0]
    (d / src.name).write_bytes(src.read_bytes())
    (d / "config.json").write_text(json.dumps({"lr": 0.1, "layers": [1, 2]}))
    (d / "metrics.json.gz").write_bytes(gzip.compress(b'{"loss": 1.0}'))
    res = CliRunner().invoke(main, ["import-trace", str(d), str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    assert "skipped" in res.stderr and "config.json" in res.stderr
    assert "metrics.json.gz" in res.stderr
    assert res.stdout.count("imported ") == 1
    # named explicitly, a non-trace is still an error (one line, exit 2)
    bad = CliRunner().invoke(main, ["import-trace", str(d / "config.json"),
                                    str(tmp_path / "run2")])
    assert bad.exit_code == 2 and "traceEvents" in bad.output
