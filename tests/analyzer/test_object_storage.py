"""Run directories in object storage, read by the analyzer: against a real S3 API server
(moto's server mode on 127.0.0.1, a free port), through pyarrow's S3 filesystem and the
standard ``AWS_ENDPOINT_URL`` and credential variables, never a patched client."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from tracealyze.analyzer.cli import main
from tracealyze.format import storage

from tests.runfactory import make_run, upload_run


def _summary(target: str) -> dict:
    res = CliRunner().invoke(main, ["summary", target, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    out["run"].pop("heartbeat_age_s", None)
    return out


def test_summary_report_and_query_of_a_run_in_a_bucket(s3: str, tmp_path: Path) -> None:
    local = make_run(tmp_path, steps=120, tensors=3, seed=4,
                     grad_norm=[1.0] * 60 + [1.0 * 1.25 ** i for i in range(60)])
    url = f"s3://{s3}/team/runs/exp1"
    upload_run(local, url)
    assert _summary(url) == _summary(str(local))  # the same findings, run id and counts

    res = CliRunner().invoke(main, ["report", url, "-o", f"{url}/report.html"])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == f"{url}/report.html"
    loc = storage.locate(url)
    assert loc.fs.get_file_info(f"{loc.root}/report.html").size > 10_000
    page = storage.read_bytes(loc, "report.html").decode()
    assert "<h1>exp1" in page  # named after the URL, not the cache folder
    # without -o: ./exp1.html here, and nothing more written into the store
    before = {f.rel: (f.size, f.mtime_ns) for f in storage.list_run(loc)}
    runner = CliRunner()
    with runner.isolated_filesystem(temp_dir=tmp_path):
        res = runner.invoke(main, ["report", url])
        assert res.exit_code == 0, res.output
        assert res.output.strip() == "exp1.html" and Path("exp1.html").stat().st_size > 10_000
    assert {f.rel: (f.size, f.mtime_ns) for f in storage.list_run(loc)} == before

    res = CliRunner().invoke(main, ["query", url, "SELECT count(*) AS n FROM steps",
                                    "--format", "csv"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[-1] == "120"

    other = make_run(tmp_path, name="other", steps=30, seed=5)
    upload_run(other, f"s3://{s3}/team/runs/exp2")
    res = CliRunner().invoke(main, ["query", url, f"s3://{s3}/team/runs/exp2",
                                    "SELECT run_path, count(*) FROM steps GROUP BY ALL "
                                    "ORDER BY 2", "--format", "csv"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[1:] == [f"s3://{s3}/team/runs/exp2,30", f"{url},120"]
    # a pattern (no shell can glob a URL): every run under it, a non-run prefix left out
    upload_run(other, f"s3://{s3}/team/other/exp3")
    res = CliRunner().invoke(main, ["query", f"s3://{s3}/team/runs/exp*",
                                    "SELECT run_path, count(*) FROM steps GROUP BY ALL "
                                    "ORDER BY 2", "--format", "csv"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[1:] == [f"s3://{s3}/team/runs/exp2,30", f"{url},120"]
    res = CliRunner().invoke(main, ["query", f"s3://{s3}/nothing/*", "SELECT 1"])
    assert res.exit_code == 2 and "names no run" in res.output


def test_a_second_command_fetches_only_what_changed(s3: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from tracealyze.analyzer.run import inplace, remote

    local = make_run(tmp_path, steps=40, parts=4, seed=1)
    url = f"s3://{s3}/r"
    upload_run(local, url)
    fetched: list[str] = []
    real = storage.read_bytes  # (what the mirror's fetch reads with, imported by name)
    monkeypatch.setattr(remote, "read_bytes", lambda loc, rel: fetched.append(rel)
                        or real(loc, rel))
    ranged: list[str] = []  # the parts' ranged reads
    real_range = inplace.RangeCache._fetch
    monkeypatch.setattr(inplace.RangeCache, "_fetch", lambda self, a, b: ranged.append(
        self.f.rel) or real_range(self, a, b))
    first = remote.mirror(url)  # (the small files whole; the parts are read in place)
    assert "run.json" in fetched and not any(r.endswith(".parquet") for r in fetched)
    before = _summary(url)
    assert any(r.startswith("steps/") for r in ranged)
    fetched.clear()
    ranged.clear()
    assert _summary(url) == before and fetched == [] and ranged == []
    assert remote.mirror(url) == first
    # a part merged away on the store: its cached ranges are gone from the mirror too
    loc = storage.locate(url)
    gone = next(f.rel for f in storage.list_run(loc) if f.rel.startswith("steps/"))
    assert list((first / inplace.RANGES).glob(f"{gone}@*"))
    loc.fs.delete_file(f"{loc.root}/{gone}")
    remote.mirror(url)
    assert not list((first / inplace.RANGES).glob(f"{gone}@*"))


def test_hostile_keys_never_leave_the_run_prefix(s3: str, tmp_path: Path) -> None:
    local = make_run(tmp_path, steps=20, seed=2)
    url = f"s3://{s3}/p/run"
    upload_run(local, url)
    upload_run(local, f"s3://{s3}/p/run2")  # a sibling prefix that starts the same
    loc = storage.locate(url)
    for key in ("p/run/../escape/run.json", "p/run/steps/rank=0/../../../x.parquet",
                "p/run/steps/rank=0/part-000009.parquet%2F..%2F..%2Fy",
                "p/run/steps/rank=x/part-000001.parquet", "p/run/.hidden/run.json",
                "p/run/traces/rank=0/a\\b.json"):
        with loc.fs.open_output_stream(f"{s3}/{key}") as o:
            o.write(b"PAR1 not data")
    from tracealyze.analyzer.run import inplace
    from tracealyze.analyzer.run.remote import mirror

    dest = mirror(url)
    got = [p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()]
    cached = {g.split("/", 1)[1].rsplit("@", 1)[0] for g in got if g.startswith(".ranges/")}
    parts = list(inplace._run_of(dest).files)  # (read in place)
    assert cached == set(parts)  # (their footers, fetched ahead)
    got = [g for g in got if not g.startswith(".ranges/")] + parts
    want = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    assert sorted(g for g in got if g != remote_manifest()) == want
    assert _summary(url) == _summary(str(local))
    assert not (tmp_path / "cache" / "escape").exists()


def remote_manifest() -> str:
    from tracealyze.analyzer.run.remote import MANIFEST

    return MANIFEST


@pytest.mark.parametrize("target, words", [
    ("s3://no-such-bucket-here/x", "no such bucket: no-such-bucket-here"),
    ("ftp://host/run", "unsupported storage URL scheme 'ftp'"),
    ("s3:///run", "no bucket"),
])
def test_a_url_that_cannot_be_read_is_one_line_and_exit_2(s3: str, target: str,
                                                           words: str) -> None:
    res = CliRunner().invoke(main, ["summary", target])
    assert res.exit_code == 2, res.output
    assert words in res.output and len(res.output.strip().splitlines()) == 1
    assert "Traceback" not in res.output


def test_refused_credentials_are_one_line_for_the_analyzer_and_a_value_error_for_the_recorder(
        s3: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # moto checks signatures once this count of unauthenticated calls is spent: our "test"
    # key is then unknown to it, as a revoked or mistyped key is to a real store
    import moto.settings

    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    res = CliRunner().invoke(main, ["summary", f"s3://{s3}/x"])
    assert res.exit_code == 2, res.output
    assert "cannot read" in res.output and "INVALID_ACCESS_KEY_ID" in res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    torch = pytest.importorskip("torch")
    from tracealyze.recorder import Recorder

    with pytest.raises(ValueError, match=r"cannot record to .*INVALID_ACCESS_KEY_ID"):
        Recorder(f"s3://{s3}/run", model=torch.nn.Linear(2, 2))


def test_a_prefix_without_run_json_is_not_a_run(s3: str) -> None:
    res = CliRunner().invoke(main, ["summary", f"s3://{s3}/empty"])
    assert res.exit_code == 2 and "no run.json" in res.output


_SEG = st.sampled_from(["..", ".", "", "steps", "rank=0", "rank=-1", "ranks", "traces",
                        "run.json", "rank=3.json", "part-000001.parquet", "a.json", "x\\y",
                        "/", "%2e%2e", "part-1-2.parquet"])


@given(st.lists(_SEG, min_size=1, max_size=5))
def test_a_run_file_name_never_climbs_or_leaves_the_format(segs: list[str]) -> None:
    rel = "/".join(segs)
    kind = storage.run_file(rel)
    if kind is None:
        return
    parts = rel.split("/")
    assert ".." not in parts and "." not in parts and "" not in parts and "\\" not in rel
    base = Path("/mirror")
    assert (base / rel).resolve().is_relative_to(base)


def test_import_trace_into_a_url(s3: str, tmp_path: Path) -> None:
    """A profiler trace imported into a run in a bucket (and into a prefix with no run yet)
    lands there as trace_events parts; what was already there is not uploaded again."""
    trace = Path(__file__).resolve().parents[1] / "data" / "traces" / \
        "gpu_alexnet_cuda_sync.json.gz"
    local = make_run(tmp_path, steps=20, seed=3)
    url = f"s3://{s3}/with-run"
    upload_run(local, url)
    loc = storage.locate(url)
    before = {f.rel: f.mtime_ns for f in storage.list_run(loc)}
    for target in (url, f"s3://{s3}/new-run"):
        res = CliRunner().invoke(main, ["import-trace", str(trace), target, "-q"])
        assert res.exit_code == 0, res.output
        q = CliRunner().invoke(main, ["query", target, "SELECT count(*) FROM trace_events",
                                      "--format", "csv"])
        assert int(q.output.splitlines()[-1]) > 100, q.output
    after = {f.rel: f.mtime_ns for f in storage.list_run(loc)}
    assert all(after[rel] == t for rel, t in before.items() if rel != "run.json")
    assert any(rel.startswith("trace_events/") for rel in after)


def test_a_fleet_under_a_bucket_prefix(s3: str, tmp_path: Path) -> None:
    """Runs at any depth under a prefix, found by one listing; keys that are not run files,
    and a run's own sub-prefixes, are never taken for runs; a second fleet reuses the rows
    (kept in the local cache for a URL root); a deleted run leaves the index."""
    from tracealyze.analyzer.fleet.fleet import run_fleet

    local = tmp_path / "local"
    make_run(local, name="a", steps=50, seed=1)
    make_run(local / "team" / "x", name="b", steps=70, seed=2, status="crashed")
    for name in ("a", "team/x/b"):
        upload_run(local / name, f"s3://{s3}/fleet/{name}")
    loc = storage.locate(f"s3://{s3}/fleet")
    with loc.fs.open_output_stream(f"{loc.root}/notes/readme.txt") as o:
        o.write(b"not a run")
    root = f"s3://{s3}/fleet"
    first = run_fleet([root], jobs=1)
    assert sorted(r["path"] for r in first.runs) == [f"{root}/a", f"{root}/team/x/b"]
    assert {r["path"]: r["status"] for r in first.runs}[f"{root}/team/x/b"] == "crashed"
    assert str(first.index).startswith(str(tmp_path / "cache"))
    again = run_fleet([root], jobs=1)
    assert (again.analysed, again.reused) == (0, 2)
    for f in storage.list_run(storage.locate(f"{root}/a")):
        storage.delete(storage.locate(f"{root}/a"), f.rel)
    third = run_fleet([root], jobs=1)
    assert [r["path"] for r in third.runs] == [f"{root}/team/x/b"] and third.removed == 1
    res = CliRunner().invoke(main, ["query", "--fleet", root, "SELECT path, steps FROM runs",
                                    "--format", "csv"])
    assert res.exit_code == 0 and f"{root}/team/x/b,70" in res.output


def test_query_fetches_only_the_tables_its_sql_reads(s3: str, tmp_path: Path) -> None:
    local = make_run(tmp_path, name="r", steps=300, tensors=40, metrics={"acc": 0.5})
    url = f"s3://{s3}/runs/sel"
    upload_run(local, url)
    cache = tmp_path / "cache"

    def mirrored(table: str) -> int:  # parts of which some bytes were read
        return sum(1 for p in cache.rglob(f".ranges/{table}/rank=*/*.json"))

    res = CliRunner().invoke(main, ["query", url, "SELECT count(*) AS n FROM steps",
                                    "--format", "csv"])
    assert res.exit_code == 0 and res.output.splitlines()[-1] == "300", res.output
    assert mirrored("steps") >= 1 and mirrored("tensor_stats") == 0 and mirrored("memory") == 0
    res = CliRunner().invoke(main, ["query", url, "SELECT count(DISTINCT name) FROM grads",
                                    "--format", "csv"])
    assert res.output.splitlines()[-1] == "40" and mirrored("tensor_stats") >= 1
    # a command that reads everything then fetches the rest, and answers as the local run
    assert _summary(url)["findings"] == _summary(str(local))["findings"]
    assert mirrored("memory") >= 1
