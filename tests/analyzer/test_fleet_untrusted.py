"""A fleet root is data from strangers (issue 42, fleet): whatever is planted under it (links
where the index is written, a forged or huge index, folders thousands deep, names that are
not UTF-8, runs with no data), ``fleet`` and ``query --fleet`` never write outside the root,
never read a run the index merely names, and end with exit 0 or with one line and exit 2,
never a traceback. Each test keeps a honeypot outside the root and checks it is untouched."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from tracealyze.analyzer.cli import main

from tests.runfactory import make_run, write_run_json


def cli(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def ok_or_one_line(res: Result) -> Result:
    """Exit 0, or exit 2 with exactly one line on stderr; never a traceback."""
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code in (0, 2), (res.exit_code, res.output, res.exception)
    if res.exit_code == 2:
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    return res


@dataclass
class Honeypot:
    """A file and a folder outside the root that nothing may change."""

    file: Path
    folder: Path

    def __post_init__(self) -> None:
        self.before = self.state()

    def state(self) -> tuple[bytes, int, list[str]]:
        return (self.file.read_bytes(), self.file.stat().st_mtime_ns,
                sorted(str(p.relative_to(self.folder)) for p in self.folder.rglob("*")))

    def untouched(self) -> None:
        assert self.state() == self.before


@pytest.fixture
def honey(tmp_path: Path) -> Honeypot:
    folder = tmp_path / "outside"
    folder.mkdir()
    f = folder / "honey.txt"
    f.write_bytes(b"precious\n")
    os.utime(f, ns=(1_000_000_000, 1_000_000_000))
    return Honeypot(f, folder)


def fleet_root(tmp_path: Path, runs: int = 2) -> Path:
    root = tmp_path / "root"
    for i in range(runs):
        make_run(root / "team", name=f"r{i}", steps=30 + i, seed=i)
    return root


# -- 1. writes never follow links ----------------------------------------------------------

def test_planted_temporary_names_are_never_written_through(tmp_path: Path,
                                                           honey: Honeypot) -> None:
    root = fleet_root(tmp_path)
    index = root / "_tracealyze" / "fleet"
    for folder in (index, index / "runs", index / "findings", index / "ranks"):
        folder.mkdir(parents=True)
    for name, folder in (("index.json", index), ("data.parquet", index / "runs"),
                         ("data.parquet", index / "findings")):
        for pid in {os.getpid(), os.getppid()}:  # the names the old code chose
            (folder / f".{name}.{pid}.tmp").symlink_to(honey.file)
    res = ok_or_one_line(cli("fleet", root, "--jobs", "1", "--json"))
    assert res.exit_code == 0
    assert len(json.loads(res.stdout)["runs"]) == 2
    honey.untouched()


@pytest.mark.parametrize("planted", ["_tracealyze", "_tracealyze/fleet",
                                     "_tracealyze/fleet/runs",
                                     "_tracealyze/fleet/runs/data.parquet",
                                     "_tracealyze/fleet/index.json",
                                     "_tracealyze/fleet/.lock"])
def test_a_link_where_the_index_is_written_is_refused(tmp_path: Path, honey: Honeypot,
                                                      planted: str) -> None:
    root = fleet_root(tmp_path, runs=1)
    link = root / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    is_file = "." in Path(planted).name
    # a file name points at a file that does not exist yet (a create outside the root), a
    # folder name at the outside folder (writes into it)
    link.symlink_to(honey.folder / "new.txt" if is_file else honey.folder)
    res = ok_or_one_line(cli("fleet", root, "--jobs", "1"))
    assert res.exit_code == 2 and "symbolic link" in res.stderr, res.output
    honey.untouched()
    assert not (honey.folder / "new.txt").exists()
    # the index the user names is theirs: the same command with --index works
    res = ok_or_one_line(cli("fleet", root, "--jobs", "1", "--index", tmp_path / "mine"))
    assert res.exit_code == 0
    honey.untouched()


def test_the_page_and_reports_are_never_written_through_links(tmp_path: Path,
                                                              honey: Honeypot) -> None:
    root = fleet_root(tmp_path, runs=2)
    os.mkdir(os.fsencode(root) + b"/\xff")  # a skipped entry: its warning is not said when
    write_run_json(os.fsdecode(os.fsencode(root) + b"/\xff"))  # the command fails (1 line)
    site = tmp_path / "site"
    site.mkdir()
    (site / "fleet-reports").symlink_to(honey.folder)
    res = ok_or_one_line(cli("fleet", root, "--jobs", "1", "-o", site / "fleet.html",
                             "--reports"))
    assert res.exit_code == 2 and "symbolic link" in res.stderr
    honey.untouched()
    # a report's own name planted as a link: that report is left out, the rest written
    (site / "fleet-reports").unlink()
    (site / "fleet-reports").mkdir()
    from tracealyze.analyzer.fleet.page import report_name

    (site / "fleet-reports" / report_name(str(root / "team" / "r0"))).symlink_to(honey.file)
    res = ok_or_one_line(cli("fleet", root, "--jobs", "1", "-o", site / "fleet.html",
                             "--reports"))
    assert res.exit_code == 0
    assert (site / "fleet-reports" / report_name(str(root / "team" / "r1"))).is_file()
    honey.untouched()


# -- 2. the index is read as untrusted input -------------------------------------------------

def _forge(table_file: Path, rows: int, **values: object) -> None:
    """Replace an index table by ``rows`` copies of one row of ``values``."""
    schema = pq.read_schema(table_file)
    t = pa.Table.from_pylist([{"path": "/etc", "run_id": "x"} | values], schema=schema)
    t = t.take(pa.array(np.zeros(rows, dtype=np.int64)))
    pq.write_table(t, table_file, compression="zstd")


def test_a_forged_index_of_a_million_rows_is_refused_in_a_second(tmp_path: Path,
                                                                 honey: Honeypot) -> None:
    root = fleet_root(tmp_path)
    assert cli("fleet", root, "--jobs", "1").exit_code == 0
    runs_file = root / "_tracealyze" / "fleet" / "runs" / "data.parquet"
    _forge(runs_file, 1_000_000, path="/etc")
    assert runs_file.stat().st_size < 1_000_000  # small on disk, huge once decoded
    t0 = time.perf_counter()
    res = ok_or_one_line(cli("query", "--fleet", root, "SELECT count(*) FROM runs"))
    assert res.exit_code == 2 and "1,000,000 rows" in res.stderr
    res = ok_or_one_line(cli("fleet", root, "--jobs", "1", "--json"))
    assert time.perf_counter() - t0 < 10  # (was 342 s and a MemoryError)
    assert res.exit_code == 0 and "1,000,000 rows" in res.stderr
    assert len(json.loads(res.stdout)["runs"]) == 2  # rebuilt from the runs themselves
    assert pq.read_metadata(runs_file).num_rows == 2
    # findings: bounded by the runs they belong to
    _forge(root / "_tracealyze" / "fleet" / "findings" / "data.parquet", 1_000_000)
    res = ok_or_one_line(cli("fleet", root, "--jobs", "1"))
    assert res.exit_code == 0 and "findings" in res.stderr
    honey.untouched()


def test_an_index_json_too_large_or_a_link_is_not_read(tmp_path: Path,
                                                       honey: Honeypot) -> None:
    root = fleet_root(tmp_path, runs=1)
    assert cli("fleet", root, "--jobs", "1").exit_code == 0
    meta = root / "_tracealyze" / "fleet" / "index.json"
    meta.write_text(json.dumps({"format": 1, "pad": "x" * 1_000_000}))
    res = ok_or_one_line(cli("fleet", root, "--jobs", "1", "--json"))
    assert res.exit_code == 0 and json.loads(res.stdout)["analysed"] == 1  # rebuilt
    assert len(meta.read_bytes()) < 1000
    honey.untouched()


def test_forged_rows_are_dropped_and_never_read(tmp_path: Path, honey: Honeypot) -> None:
    root = fleet_root(tmp_path)  # 30 + 31 steps
    victim = make_run(tmp_path / "elsewhere", name="victim", steps=77, seed=7)
    (root / "team" / "linked").symlink_to(victim)  # a link to a run outside the root
    assert cli("fleet", root, "--jobs", "1").exit_code == 0
    index = root / "_tracealyze" / "fleet"
    t = pq.read_table(index / "runs" / "data.parquet")
    real = t.to_pylist()
    forged = [real[0] | {"path": p, "status": "completed"} for p in
              ("/etc", str(victim), str(root / "team" / "linked"),
               str(root / "team" / ".." / ".." / "elsewhere" / "victim"))]
    pq.write_table(pa.Table.from_pylist(real + forged, schema=t.schema),
                   index / "runs" / "data.parquet")
    res = ok_or_one_line(cli("query", "--fleet", root, "SELECT count(*) AS n FROM steps",
                             "--format", "csv"))
    assert res.exit_code == 0 and res.stdout.splitlines()[-1] == "61", res.output
    assert "4 row(s) of the fleet index" in res.stderr
    res = ok_or_one_line(cli("query", "--fleet", root, "SELECT path FROM runs ORDER BY 1",
                             "--format", "csv"))
    assert res.stdout.split() == ["path", str(root / "team" / "r0"), str(root / "team" / "r1")]
    res = ok_or_one_line(cli("fleet", root, "--jobs", "1", "--json"))
    assert res.exit_code == 0 and "dropped 4 row(s)" in res.stderr
    assert sorted(pq.read_table(index / "runs" / "data.parquet").column("path").to_pylist()
                  ) == [str(root / "team" / "r0"), str(root / "team" / "r1")]
    honey.untouched()


# -- 3. one bad entry never stops everyone ---------------------------------------------------

def test_a_folder_tree_thousands_deep_is_walked_without_recursion(tmp_path: Path,
                                                                  honey: Honeypot) -> None:
    root = fleet_root(tmp_path, runs=1)
    fd = os.open(root, os.O_RDONLY)
    chain = []
    try:
        for _ in range(1500):  # (os.makedirs itself recurses: one level at a time)
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY, dir_fd=fd)
            chain.append(fd)
            fd = nfd
    finally:
        chain.append(fd)
    try:
        res = ok_or_one_line(cli("fleet", root, "--jobs", "1", "--json"))
        assert res.exit_code == 0
        out = json.loads(res.stdout)
        assert [Path(r["path"]).name for r in out["runs"]] == ["r0"]
        (skip,) = out["skipped"]
        assert "64" in skip["reason"] and skip["path"].count("/d") == 64
        assert "warning: skipped" in res.stderr
    finally:  # (rmtree recurses too: undo the chain from its end)
        for i in range(len(chain) - 1, 0, -1):
            os.rmdir("d", dir_fd=chain[i - 1])
        for f in chain:
            os.close(f)
    honey.untouched()


def test_a_run_whose_name_is_not_utf8_is_skipped_with_a_line(tmp_path: Path,
                                                             honey: Honeypot) -> None:
    root = fleet_root(tmp_path, runs=1)
    bad = os.fsdecode(os.fsencode(root) + b"/caf\xe9")
    os.mkdir(bad)
    write_run_json(bad, status="completed")
    res = ok_or_one_line(cli("fleet", root, "--jobs", "1", "--json"))
    assert res.exit_code == 0
    out = json.loads(res.stdout)
    assert [Path(r["path"]).name for r in out["runs"]] == ["r0"]
    assert out["skipped"] == [{"path": f"{root}/caf\\xe9", "reason": out["skipped"][0]["reason"]}]
    assert f"warning: skipped {root}/caf\\xe9: " in res.stderr
    assert "1 entry under the roots skipped" in res.stderr
    honey.untouched()


def test_a_run_with_only_run_json_leaves_the_run_tables_queryable(tmp_path: Path,
                                                                  honey: Honeypot) -> None:
    root = tmp_path / "root"
    write_run_json(root / "bare", status="completed")
    assert cli("fleet", root, "--jobs", "1").exit_code == 0
    res = ok_or_one_line(cli("query", "--fleet", root, "SELECT count(*) FROM steps",
                             "--format", "csv"))
    assert res.exit_code == 0 and res.stdout.splitlines()[-1] == "0", res.output
    res = ok_or_one_line(cli("query", "--fleet", root, "SELECT (SELECT max(step) FROM "
                             "steps), (SELECT count(name) FROM grads)", "--format", "csv"))
    assert res.exit_code == 0, res.output  # the empty views have their columns
    make_run(root, name="real", steps=40)
    assert cli("fleet", root, "--jobs", "1").exit_code == 0
    res = ok_or_one_line(cli("query", "--fleet", root, "SELECT count(*) FROM steps",
                             "--format", "csv"))
    assert res.exit_code == 0 and res.stdout.splitlines()[-1] == "40", res.output
    honey.untouched()


def test_odd_values_in_a_run_json_are_a_row_not_a_crash(tmp_path: Path,
                                                        honey: Honeypot) -> None:
    root = fleet_root(tmp_path, runs=1)
    meta = write_run_json(root / "odd", status="completed")
    meta.update(run_id="\ud800x", host="h\ud800", world_size=1 << 70,
                model={"class": ["not", "text"], "parameters": 1 << 70})
    (root / "odd" / "run.json").write_text(json.dumps(meta))  # (escapes the lone surrogate)
    (root / "torn").mkdir()
    (root / "torn" / "run.json").write_bytes(b"\xff\xfe{")
    res = ok_or_one_line(cli("fleet", root, "--jobs", "1", "--json"))
    assert res.exit_code == 0, res.output
    rows = {Path(r["path"]).name: r for r in json.loads(res.stdout)["runs"]}
    assert set(rows) == {"r0", "odd", "torn"} and rows["torn"]["status"] == "unreadable"
    assert ok_or_one_line(cli("query", "--fleet", root, "SELECT * FROM runs")).exit_code == 0
    honey.untouched()
