"""A run in object storage is read in place: a query fetches the footers and the column
chunks it reads (ranged GETs against a real S3 API server, the ``s3`` fixture), keeps them
for the next command, answers as the local run, and never reads outside the run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from tracealyze.analyzer.cli import main
from tracealyze.analyzer.run import inplace
from tracealyze.analyzer.run.catalog import open_run
from tracealyze.format import storage

from tests.runfactory import make_run, upload_run


def _query(target: str, sql: str) -> list[str]:
    res = CliRunner().invoke(main, ["query", target, sql, "--format", "csv"])
    assert res.exit_code == 0, res.output
    return res.output.splitlines()


def _fetched(cache: Path, table: str) -> tuple[int, int]:
    """(bytes held in the range cache, bytes of the parts) of ``table``."""
    held = size = 0
    for index in cache.rglob(f".ranges/{table}/rank=*/*.json"):
        held += sum(b - a for a, b in json.loads(index.read_text()))
        size += int(index.name.rsplit("@", 1)[1].split("-")[0])
    return held, size


@pytest.fixture()
def wide(s3: str, tmp_path: Path) -> tuple[Path, str]:
    """A run whose tensor_stats part is several MB (many columns, 750,000 rows)."""
    local = make_run(tmp_path, name="wide", steps=5000, tensors=50, seed=3)
    url = f"s3://{s3}/runs/wide"
    upload_run(local, url)
    return local, url


def test_a_query_fetches_the_columns_it_reads_not_the_file(wide: tuple[Path, str],
                                                           tmp_path: Path) -> None:
    local, url = wide
    cache = tmp_path / "cache"
    sql = "SELECT count(*), max(step), count(DISTINCT name) FROM tensor_stats"
    assert _query(url, sql) == _query(str(local), sql)
    held, size = _fetched(cache, "tensor_stats")
    assert size > 4 * inplace.BLOCK  # (else the block rounding would read it all)
    assert 0 < held < 0.35 * size, (held, size)
    # every column: the rest of the file, and the same rows as the local run
    sql = "SELECT * FROM tensor_stats ORDER BY step, name, kind"
    assert _query(url, sql) == _query(str(local), sql)
    held, _ = _fetched(cache, "tensor_stats")
    assert held > 0.9 * size


def test_the_next_command_reads_the_cache_not_the_store(wide: tuple[Path, str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _, url = wide
    sql = "SELECT kind, avg(norm) FROM tensor_stats GROUP BY kind ORDER BY kind"
    first = _query(url, sql)
    ranged: list[tuple[int, int]] = []
    real = inplace.RangeCache._fetch
    monkeypatch.setattr(inplace.RangeCache, "_fetch",
                        lambda self, a, b: ranged.append((a, b)) or real(self, a, b))
    assert _query(url, sql) == first and ranged == []


def test_a_damaged_or_unwritable_cache_still_gives_the_right_answer(
        wide: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local, url = wide
    sql = "SELECT step, name, kind, norm FROM tensor_stats WHERE step % 97 = 0 ORDER BY ALL"
    want = _query(str(local), sql)
    assert _query(url, sql) == want
    cache = tmp_path / "cache"
    index = next(cache.rglob(".ranges/tensor_stats/rank=*/*.json"))
    index.write_text("[[0, 99999999999]]")  # claims more than the object holds: ignored
    assert _query(url, sql) == want
    index.write_text('{"torn')
    assert _query(url, sql) == want
    Path(str(index)[:-5]).unlink()  # the data gone, the list left
    index.write_text(json.dumps([[0, 1 << 20]]))
    assert _query(url, sql) == want

    def full(*a: object) -> int:
        raise OSError(28, "No space left on device")

    for p in cache.rglob(".ranges/*"):
        if p.is_file():
            p.unlink()
    monkeypatch.setattr(os, "fsync", full)
    assert _query(url, sql) == want  # served from memory


def test_a_query_cannot_name_another_run_or_a_file_outside_the_listing(
        s3: str, tmp_path: Path) -> None:
    a, b = (make_run(tmp_path, name=n, steps=30, seed=i) for i, n in enumerate("ab"))
    upload_run(a, f"s3://{s3}/x/a")
    upload_run(b, f"s3://{s3}/x/b")
    with open_run(f"s3://{s3}/x/b") as rb:
        other = inplace.sql_path(rb.files["steps"][0])
    assert other.startswith(f"{inplace.PROTOCOL}://")
    with open_run(f"s3://{s3}/x/a") as ra:
        mine = inplace.sql_path(ra.files["steps"][0])
        base = mine.rsplit("/", 3)[0]
        assert ra.query(f"SELECT count(*) FROM read_parquet('{mine}')")[1] == [(30,)]
        for name in (other, f"{base}/steps/rank=0/part-999999.parquet",
                     f"{base}/steps/rank=0/../../../b/run.json", f"{base}/run.json",
                     "s3://" + s3 + "/x/b/steps/rank=0/part-000001.parquet"):
            with pytest.raises(Exception) as e:
                ra.query(f"SELECT * FROM read_parquet('{name}')")
            assert any(w in str(e.value) for w in ("No such file", "No files found",
                                                   "disabled by configuration")), name
    res = CliRunner().invoke(main, ["query", f"s3://{s3}/x/a",
                                    f"SELECT * FROM read_parquet('{other}')"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output


def test_a_part_merged_away_under_an_open_run_is_read_from_the_merged_part(
        s3: str, tmp_path: Path) -> None:
    local = make_run(tmp_path, steps=80, parts=4, seed=6)
    url = f"s3://{s3}/live"
    upload_run(local, url)
    loc = storage.locate(url)
    singles = sorted(f.rel for f in storage.list_run(loc) if f.rel.startswith("steps/"))
    assert len(singles) == 4
    with open_run(url) as run:
        assert run.query("SELECT count(*) FROM steps")[1] == [(80,)]
        # the writer merges: the merged object first, then the parts it covers go
        merged = pa.concat_tables(pq.read_table(local / s) for s in singles)
        sink = pa.BufferOutputStream()
        pq.write_table(merged, sink)
        storage.write_bytes(loc, "steps/rank=0/part-000001-000004.parquet",
                            sink.getvalue().to_pybytes())
        for s in singles:
            storage.delete(loc, s)
        for cache in (tmp_path / "cache").rglob(".ranges/steps/rank=0/*"):
            cache.unlink()  # (else the cache would still answer for the deleted parts)
        assert run.query("SELECT count(*), count(DISTINCT step) FROM steps")[1] == [(80, 80)]


def test_a_store_that_stops_answering_is_one_line_not_a_skipped_part(
        wide: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    _, url = wide

    class Down:  # the store's filesystem once it stopped answering
        def open_input_file(self, path: str) -> None:
            raise OSError("AWS Error NETWORK_CONNECTION during HeadObject operation: "
                          "curlCode: 7, Couldn't connect to server")

        get_file_info = open_input_file

    real = inplace.RangeCache.__init__

    def down(self: inplace.RangeCache, loc: storage.Location, *a: object) -> None:
        real(self, storage.Location(loc.url, Down(), loc.root), *a)

    monkeypatch.setattr(inplace.RangeCache, "__init__", down)
    for cmd in (["summary", url], ["query", url, "SELECT max(norm) FROM tensor_stats"]):
        res = CliRunner().invoke(main, cmd)
        assert res.exit_code == 2, res.output
        line = res.output.strip()
        assert len(line.splitlines()) == 1 and "Couldn't connect to server" in line, line
        assert "unreadable" not in line and "Traceback" not in line
    monkeypatch.setattr(inplace.RangeCache, "__init__", real)  # the store is back
    summary = CliRunner().invoke(main, ["summary", url, "--json"])
    assert summary.exit_code == 0, summary.output
    assert "dropped_data" not in {f["id"] for f in json.loads(summary.output)["findings"]}


def test_merged_and_covered_parts_in_the_bucket_count_once(s3: str, tmp_path: Path) -> None:
    """A reader between a merge's upload and its deletes sees both: the merged part
    supersedes the parts it covers, in a bucket's listing as on disk."""
    local = make_run(tmp_path, steps=60, parts=3, seed=8)
    singles = sorted((local / "steps" / "rank=0").glob("part-*.parquet"))
    merged = pa.concat_tables(pq.read_table(s) for s in singles)
    pq.write_table(merged, local / "steps" / "rank=0" / "part-000001-000003.parquet")
    url = f"s3://{s3}/both"
    upload_run(local, url)
    assert _query(url, "SELECT count(*), count(DISTINCT step) FROM steps")[-1] == "60,60"


def test_a_run_of_many_small_parts_reads_from_the_bucket(s3: str, tmp_path: Path) -> None:
    """More parts than are read straight from their files (held.HOLD_PARTS): an
    uncompacted run, read part by part ahead of the views, from the store."""
    local = make_run(tmp_path, steps=600, parts=300, seed=9)
    url = f"s3://{s3}/many"
    upload_run(local, url)
    sql = "SELECT count(*), sum(loss) FROM steps"
    assert _query(url, sql) == _query(str(local), sql)


def test_compare_and_tables_of_runs_in_a_bucket_name_them_by_url(s3: str,
                                                                 tmp_path: Path) -> None:
    base = make_run(tmp_path, name="base", steps=80, seed=1)
    new = make_run(tmp_path, name="new", steps=80, seed=1, step_time=0.2)
    urls = [f"s3://{s3}/cmp/base", f"s3://{s3}/cmp/new"]
    upload_run(base, urls[0])
    upload_run(new, urls[1])
    res = CliRunner().invoke(main, ["compare", *urls, "--json"])
    local = CliRunner().invoke(main, ["compare", str(base), str(new), "--json"])
    got, want = json.loads(res.output), json.loads(local.output)
    assert res.exit_code == local.exit_code, res.output
    assert [got["base"]["path"], got["new"]["path"]] == urls  # not the cache folders
    for side in ("base", "new"):
        got[side].pop("path"), want[side].pop("path")
    assert got == want
    res = CliRunner().invoke(main, ["tables", urls[0]])
    assert res.exit_code == 0 and res.output == CliRunner().invoke(
        main, ["tables", str(base)]).output
