"""analyzer/writes.py: the one way the analyzer writes files. A stranger's links at any name
it might create are never written through (issue 42)."""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracealyze.analyzer.cli import main
from tracealyze.analyzer.writes import Dir, OutputError, open_path, write_file

from tests.runfactory import make_run

NAMES = st.text(string.ascii_letters + string.digits + "._-", min_size=1, max_size=12).filter(
    lambda n: n not in (".", ".."))


def _honeypot(tmp_path: Path) -> tuple[Path, tuple[bytes, int]]:
    pot = tmp_path / "honeypot"
    pot.write_bytes(b"do not touch\n")
    return pot, (pot.read_bytes(), pot.stat().st_mtime_ns)


def _same(pot: Path, before: tuple[bytes, int]) -> bool:
    return (pot.read_bytes(), pot.stat().st_mtime_ns) == before


def test_write_atomic_refuses_a_link_and_leaves_no_temporary(tmp_path: Path) -> None:
    pot, before = _honeypot(tmp_path)
    folder = tmp_path / "out"
    folder.mkdir()
    os.symlink(pot, folder / "report.html")
    with Dir.open(folder) as d, pytest.raises(OutputError, match="symbolic link"):
        d.write_atomic("report.html", "<html>")
    assert _same(pot, before) and os.path.islink(folder / "report.html")
    assert sorted(os.listdir(folder)) == ["report.html"]


def test_sub_folders_are_never_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(elsewhere, root / "_tracealyze")
    with Dir.open(root) as d, pytest.raises(OutputError, match="symbolic link"):
        d.walk("_tracealyze", "fleet")
    assert list(elsewhere.iterdir()) == []
    with pytest.raises(OutputError):
        open_path(root, "_tracealyze/fleet")
    assert list(elsewhere.iterdir()) == []


def test_a_folder_swapped_for_a_link_after_opening_is_still_the_folder(tmp_path: Path) -> None:
    """The descriptor names the folder that was checked: renaming it away and planting a
    link under its name redirects nothing."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    with Dir.open(tmp_path) as top, top.sub("run") as d:
        os.rename(run, tmp_path / "moved")
        os.symlink(elsewhere, run)
        d.write_atomic("x.html", "page")
    assert (tmp_path / "moved" / "x.html").read_text() == "page"
    assert list(elsewhere.iterdir()) == []


def test_publish_never_replaces_and_locks_refuse_links(tmp_path: Path) -> None:
    pot, before = _honeypot(tmp_path)
    src = tmp_path / "staged.parquet"
    src.write_bytes(b"new part")
    d = Dir.open(tmp_path / "parts", create=True)
    with d:
        (tmp_path / "parts" / "part-000001.parquet").write_bytes(b"old part")
        assert not d.publish("part-000001.parquet", src)
        assert d.publish("part-000002.parquet", src)
        os.symlink(pot, tmp_path / "parts" / ".lock")
        with pytest.raises(OutputError, match="symbolic link"), d.locked(".lock"):
            pass
        with pytest.raises(OutputError):
            d.open_update(".lock")
    assert (tmp_path / "parts" / "part-000001.parquet").read_bytes() == b"old part"
    assert (tmp_path / "parts" / "part-000002.parquet").read_bytes() == b"new part"
    assert _same(pot, before)


def test_the_users_own_path_may_go_through_a_link(tmp_path: Path) -> None:
    """A folder the user typed is theirs (a home folder on another disk): only what is
    created inside it is guarded."""
    real = tmp_path / "disk"
    real.mkdir()
    os.symlink(real, tmp_path / "reports")
    write_file(tmp_path / "reports" / "a.html", "ok")
    assert (real / "a.html").read_text() == "ok"


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(planted=st.lists(NAMES, max_size=8), name=NAMES, pids=st.integers(1, 2**22))
def test_no_planted_link_is_ever_written_through(tmp_path: Path, planted: list[str], name: str,
                                                  pids: int) -> None:
    """Links at the destination, at every pid-style temporary name and at arbitrary names:
    the honeypot never changes; the write either lands in a regular file or is refused."""
    case = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
    case.mkdir()
    pot, before = _honeypot(case)
    folder = case / "dir"
    folder.mkdir()
    for n in {*planted, f".{name}.{pids}.tmp", f".{name}.tmp"}:
        if not (folder / n).exists() and not os.path.islink(folder / n):
            os.symlink(pot, folder / n)
    with Dir.open(folder) as d:
        try:
            d.write_atomic(name, b"payload")
            assert (folder / name).read_bytes() == b"payload"
            assert not os.path.islink(folder / name)
        except OutputError:
            assert os.path.islink(folder / name)
    assert _same(pot, before)


def test_report_of_a_run_full_of_links_writes_nothing_through_them(tmp_path: Path,
                                                                    monkeypatch) -> None:
    """The issue's repro: a run shipped with `.report.html.<pid>.tmp` links for many pids
    and report.html linked to a victim. `report RUN` writes ./<run-name>.html and nothing in
    the run; `-o RUN/report.html` is refused over the link; the victim never changes."""
    pot, before = _honeypot(tmp_path)
    run = make_run(tmp_path, name="evil", steps=20)
    for pid in range(os.getpid() - 50, os.getpid() + 50):
        os.symlink(pot, run / f".report.html.{pid}.tmp")
    os.symlink(pot, run / "report.html")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    res = CliRunner().invoke(main, ["report", str(run)])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == "evil.html" and (here / "evil.html").stat().st_size > 10_000
    res = CliRunner().invoke(main, ["report", str(run), "-o", str(run / "report.html")])
    assert res.exit_code == 2 and "symbolic link" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert _same(pot, before) and os.path.islink(run / "report.html")


def test_a_run_id_with_newlines_never_starts_a_line_of_its_own(tmp_path: Path) -> None:
    """The issue's second half: a run_id holding newlines put an attacker's line alone on a
    line of the report (the shape authorized_keys accepts) and of the summary."""
    import json

    run = make_run(tmp_path, name="r", steps=20)
    meta = json.loads((run / "run.json").read_text())
    meta["run_id"] = "x\nssh-ed25519 AAAATTACK evil@host\r\n\x1b[2Jy\u202e"
    (run / "run.json").write_text(json.dumps(meta))
    out = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", str(run), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert not any(line.lstrip().startswith("ssh-ed25519")
                   for line in out.read_text().splitlines())
    res = CliRunner().invoke(main, ["summary", str(run)])
    assert res.exit_code == 0
    first = res.output.splitlines()[0]
    assert "AAAATTACK" in first and "\x1b" not in res.output and "\u202e" not in first
