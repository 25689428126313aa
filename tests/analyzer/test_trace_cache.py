"""A run's raw profiler traces are parsed once (issue 43 item 4): the rows are kept in the
user's cache, keyed by the trace's bytes, name, rank and the analyzer's version; the next
command reads them back instead of parsing; a changed trace is parsed again; the cache is
bounded, and never followed through a link."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from tracealyze.analyzer.cli import main
from tracealyze.analyzer.ingest import read as read_mod
from tracealyze.analyzer.run.catalog import open_run
from tracealyze.analyzer.run.trace_cache import FOLDER

from tests.runfactory import make_run

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
SAMPLED = TRACES / "gpu_sampled_rank0.json.gz"
ALEXNET = TRACES / "gpu_alexnet_cuda_sync.json.gz"


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every trace the analyzer parses, in order."""
    seen: list[Path] = []
    real = read_mod.read_trace

    def counting(path, **kw):
        seen.append(Path(path))
        return real(path, **kw)

    monkeypatch.setattr(read_mod, "read_trace", counting)
    return seen


def _run_with(tmp_path: Path, trace: Path, name: str = "w.pt.trace.json.gz") -> Path:
    run = make_run(tmp_path, name="run", steps=30)
    (run / "traces" / "rank=0").mkdir(parents=True)
    shutil.copyfile(trace, run / "traces" / "rank=0" / name)
    return run


def _events(run: Path) -> list[tuple]:
    with open_run(run) as r:
        return r.query("SELECT trace_id, count(*), sum(dur_us), count(DISTINCT step) "
                       "FROM trace_events GROUP BY 1 ORDER BY 1")[1]


def test_the_second_open_reads_the_cache_and_gives_the_same_rows(
        tmp_path: Path, parses: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEALYZE_CACHE_DIR", str(tmp_path / "cache"))
    run = _run_with(tmp_path, SAMPLED)
    first = _events(run)
    assert len(parses) == 1 and first and first[0][1] > 1000
    second = _events(run)
    assert second == first and len(parses) == 1  # not parsed again
    res = CliRunner().invoke(main, ["summary", str(run), "--json"])
    assert res.exit_code == 0 and len(parses) == 1
    # what the cache holds is the user's own folder, beside the URL mirrors
    entries = sorted(p.suffix for p in (tmp_path / "cache" / FOLDER).iterdir())
    assert entries == [".id", ".parquet"]


def test_a_changed_trace_is_parsed_again(tmp_path: Path, parses: list[Path],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEALYZE_CACHE_DIR", str(tmp_path / "cache"))
    run = _run_with(tmp_path, SAMPLED)
    a = _events(run)
    shutil.copyfile(ALEXNET, run / "traces" / "rank=0" / "w.pt.trace.json.gz")  # same name
    b = _events(run)
    assert len(parses) == 2 and a != b
    off = tmp_path / "off"
    monkeypatch.setenv("TRACEALYZE_TRACE_CACHE_MB", "0")  # off: the reference
    monkeypatch.setenv("TRACEALYZE_CACHE_DIR", str(off))
    assert _events(run) == b and not (off / FOLDER).exists()


def test_the_cache_is_bounded_and_never_follows_a_link(
        tmp_path: Path, parses: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRACEALYZE_CACHE_DIR", str(cache))
    monkeypatch.setenv("TRACEALYZE_TRACE_CACHE_MB", "0.001")  # 1 KB: nothing fits
    run = _run_with(tmp_path, SAMPLED)
    want = _events(run)
    assert _events(run) == want and len(parses) == 2  # evicted at once: parsed each time
    assert sum(p.stat().st_size for p in (cache / FOLDER).iterdir()) <= 1024
    # a .traces that is a link (to anywhere) is not used: the rows are still right
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(cache / FOLDER)
    os.symlink(elsewhere, cache / FOLDER)
    monkeypatch.delenv("TRACEALYZE_TRACE_CACHE_MB")
    assert _events(run) == want and list(elsewhere.iterdir()) == []


def test_a_bad_bound_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run_with(tmp_path, SAMPLED)
    monkeypatch.setenv("TRACEALYZE_TRACE_CACHE_MB", "lots")
    res = CliRunner().invoke(main, ["summary", str(run)])
    assert res.exit_code == 2 and "TRACEALYZE_TRACE_CACHE_MB" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
