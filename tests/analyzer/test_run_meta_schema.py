"""run.json and rank files against one schema (issue N7): a field of the wrong type is left
out, named by a dropped_data finding, and never a traceback in any command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracealyze.analyzer.cli import main
from tracealyze.format.metaschema import NESTED, RANK_FIELDS, RUN_FIELDS, check_meta

from tests.runfactory import make_run

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=8)


def _commands(run: Path, other: Path) -> list[list[str]]:
    return [["summary", str(run), "--json"], ["summary", str(run)], ["tables", str(run)],
            ["query", str(run), "SELECT count(*) FROM steps"],
            ["compare", str(other), str(run), "--json"]]


def _assert_clean(args: list[str]) -> None:
    res = CliRunner().invoke(main, args)
    assert res.exit_code in (0, 1, 2), (args, res.output[-400:])
    assert res.exception is None or isinstance(res.exception, SystemExit), (
        args, repr(res.exception))


def _rewrite(path: Path, **fields) -> None:
    meta = json.loads(path.read_text())
    meta.update(fields)
    path.write_text(json.dumps(meta))


def test_the_issues_repro_and_its_kin(tmp_path: Path) -> None:
    run = make_run(tmp_path, name="run", steps=30)
    other = make_run(tmp_path, name="other", steps=30)
    _rewrite(run / "run.json", model="x", device=5, counters=[], resumes="x",
             world_size="2", knobs=3, data={"batch_size": "x"}, versions=[1],
             flush_interval_s=True, ended="yesterday")
    _rewrite(run / "ranks" / "rank=0.json", steps="many", heartbeat={"a": 1}, counters=7)
    for args in _commands(run, other):
        _assert_clean(args)
    res = CliRunner().invoke(main, ["summary", str(run), "--json"])
    found = [f for f in json.loads(res.output)["findings"] if f["id"] == "dropped_data"]
    fields = " ".join(" ".join(f["evidence"].get("fields", [])) for f in found)
    for name in ("'model'", "'device'", "'counters'", "'world_size'", "'data.batch_size'",
                 "'steps'", "'heartbeat'"):
        assert name in fields, name
    res = CliRunner().invoke(main, ["report", str(run), "-o", str(tmp_path / "r.html")])
    assert res.exit_code in (0, 1), res.output[-400:]


@pytest.mark.parametrize("fields", [RUN_FIELDS, RANK_FIELDS])
def test_check_meta_keeps_what_fits_and_names_what_does_not(fields) -> None:
    good = {"model": {"class": "M", "parameters": 3, "sharded": True}, "counters": {
        "dropped": {"steps": 2}, "recorder_errors": 0}, "rank": 0, "pid": 4, "extra": [1]}
    meta, problems = check_meta(good, fields)
    assert meta == good and problems == []
    meta, problems = check_meta({"pid": True, "counters": {"dropped": {"a": "x"}}}, fields)
    assert "pid" not in meta and meta["counters"]["dropped"] == {}
    assert len(problems) == 2


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.dictionaries(st.sampled_from(sorted({*RUN_FIELDS, *NESTED})), JSON,
                              min_size=1, max_size=6))
def test_any_json_in_any_field_is_never_a_traceback(tmp_path_factory, values) -> None:
    root = tmp_path_factory.mktemp("meta")
    run = make_run(root, name="run", steps=12)
    values.pop("schema_version", None)  # its own clear error, tested elsewhere
    _rewrite(run / "run.json", **values)
    _assert_clean(["summary", str(run), "--json"])


def test_a_run_dir_whose_name_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    """Every part used to be skipped (summary: exit 0, steps=0) and report a traceback."""
    import os

    good = make_run(tmp_path, name="good", steps=10)
    bad = os.fsdecode(os.fsencode(str(tmp_path)) + b"/run\xff")
    os.rename(good, bad)
    for args in (["summary", bad], ["summary", bad, "--json"], ["report", bad],
                 ["tables", bad], ["query", bad, "SELECT 1"]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2, (args, res.output[-300:])
        assert "not valid UTF-8" in res.output and "Traceback" not in res.output


def test_summary_json_says_killed_for_a_killed_run(tmp_path: Path) -> None:
    """N12: run.status was 'running' (only killed: true said otherwise)."""
    killed = make_run(tmp_path, name="killed", steps=20, status="running",
                      heartbeat_age_s=7200.0)
    live = make_run(tmp_path, name="live", steps=20, status="running")
    for run, status in ((killed, "killed"), (live, "running")):
        res = CliRunner().invoke(main, ["summary", str(run), "--json"])
        out = json.loads(res.output)["run"]
        assert out["status"] == status and out["killed"] == (status == "killed")


def test_compare_on_extreme_values_prints_no_numpy_warning(tmp_path: Path) -> None:
    """N16: compare printed numpy RuntimeWarnings (overflow) on NaN or extreme steps."""
    import subprocess
    import sys

    import numpy as np

    n = 120
    dur = np.full(n, 0.1)
    dur[[5, 7, 9]] = [np.nan, 1e308, np.inf]
    grad = np.full(n, 1.0)
    grad[[20, 30]] = [1e308, np.inf]
    a = make_run(tmp_path, name="a", steps=n)
    b = make_run(tmp_path, name="b", steps=n, duration=dur, grad_norm=grad,
                 loss=np.where(np.arange(n) < 50, 1.0, np.nan))
    for args in (["compare", str(a), str(b)], ["compare", str(b), str(a), "--json"],
                 ["summary", str(b)]):
        out = subprocess.run([sys.executable, "-c",
                              "from tracealyze.analyzer.cli import main; main()", *args],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode in (0, 1), out.stderr[-500:]
        assert "Warning" not in out.stderr, out.stderr[-500:]
