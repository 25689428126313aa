"""run.json's hyperparameters as the analyzer serves them: the hparams view (one run and
several), compare's 'configured differently', the fleet index's hparams column, the
report's section."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from runfactory import make_run
from tracealyze.analyzer import open_run
from tracealyze.analyzer.compare.runs import compare_runs, render_text

CLI = [sys.executable, "-c", "from tracealyze.analyzer.cli import main; main()"]


def _run(root: Path, name: str, hparams: object, seed: int = 0) -> Path:
    return make_run(root, name=name, steps=40, seed=seed,
                    run_meta={"hparams": hparams})


def test_the_view_has_one_row_per_key_with_its_type(tmp_path: Path) -> None:
    run = _run(tmp_path, "a", {"optimizer.lr": 3e-4, "seed": 1, "amp": True,
                               "betas": [0.9, 0.95], "name": "gpt", "scheduler": None})
    with open_run(run) as r:
        cols, rows = r.query("SELECT key, value, type FROM hparams ORDER BY key")
        assert cols == ["key", "value", "type"]
        assert rows == [("amp", "true", "bool"), ("betas", "[0.9, 0.95]", "list"),
                        ("name", "gpt", "str"), ("optimizer.lr", "0.0003", "float"),
                        ("scheduler", None, "null"), ("seed", "1", "int")]
        # numbers read back in SQL
        _, got = r.query("SELECT TRY_CAST(value AS DOUBLE) FROM hparams "
                         "WHERE key = 'optimizer.lr'")
        assert got == [(3e-4,)]


def test_a_run_without_hparams_has_an_empty_view_and_odd_ones_are_text(
        tmp_path: Path) -> None:
    with open_run(make_run(tmp_path, name="none", steps=10)) as r:
        assert r.query("SELECT count(*) FROM hparams")[1] == [(0,)]
    # a stranger's run.json: a list where the object goes is left out (metaschema);
    # a value that is SQL stays a value
    bad = _run(tmp_path, "bad", ["lr", 0.1])
    with open_run(bad) as r:
        assert r.query("SELECT count(*) FROM hparams")[1] == [(0,)]
    sql = _run(tmp_path, "sql", {"x'; DROP TABLE steps; --": "'); SELECT 1; --"})
    with open_run(sql) as r:
        assert r.query("SELECT key, value FROM hparams")[1] == [
            ("x'; DROP TABLE steps; --", "'); SELECT 1; --")]
        assert r.query("SELECT count(*) FROM steps")[1] == [(40,)]


def test_several_runs_line_up_by_run_id(tmp_path: Path) -> None:
    a = _run(tmp_path, "a", {"optimizer.lr": 0.1})
    b = _run(tmp_path, "b", {"optimizer.lr": 0.05}, seed=1)
    out = subprocess.run([*CLI, "query", str(a), str(b), "--format", "json",
                          "SELECT value, count(DISTINCT run_id) AS n FROM hparams "
                          "WHERE key = 'optimizer.lr' GROUP BY 1 ORDER BY 1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [{"value": "0.05", "n": 1}, {"value": "0.1", "n": 1}]


def test_compare_says_what_was_configured_differently(tmp_path: Path) -> None:
    a = _run(tmp_path, "a", {"optimizer.lr": 0.1, "seed": 1, "warmup": 100})
    b = _run(tmp_path, "b", {"optimizer.lr": 0.05, "seed": 1, "batch": 64}, seed=1)
    result = compare_runs(a, b)
    assert result["hparams_changed"] == [
        {"key": "batch", "base": None, "new": "64"},
        {"key": "optimizer.lr", "base": "0.1", "new": "0.05"},
        {"key": "warmup", "base": "100", "new": None}]
    text = render_text(result)
    assert "configured differently (3 hyperparameter(s)):" in text
    assert "  optimizer.lr: 0.1 → 0.05" in text and "  batch: (unset) → 64" in text
    same = compare_runs(a, _run(tmp_path, "c", {"optimizer.lr": 0.1, "seed": 1,
                                                "warmup": 100}, seed=2))
    assert same["hparams_changed"] == []
    assert "configured differently" not in render_text(same)


def test_fleet_groups_runs_by_a_hyperparameter(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    for i, lr in enumerate((0.1, 0.05, 0.1)):
        _run(root, f"r{i}", {"optimizer.lr": lr}, seed=i)
    _run(root, "bare", {}, seed=9)
    out = subprocess.run([*CLI, "fleet", str(root), "--format", "json"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode in (0, 1), out.stderr
    runs = {Path(r["path"]).name: r for r in json.loads(out.stdout)["runs"]}
    assert runs["r1"]["hparams"] == {"optimizer.lr": "0.05"} and runs["bare"]["hparams"] == {}
    csv = subprocess.run([*CLI, "fleet", str(root), "--format", "csv"], capture_output=True,
                         text=True, timeout=300)
    assert csv.stdout.splitlines()[0].endswith(",hparams")
    assert '"{""optimizer.lr"": ""0.1""}"' in csv.stdout
    q = subprocess.run([*CLI, "query", "--fleet", str(root), "--format", "json",
                        "SELECT hparams['optimizer.lr'] AS lr, count(*) AS n FROM runs "
                        "GROUP BY 1 ORDER BY 1 NULLS LAST"],
                       capture_output=True, text=True, timeout=300)
    assert q.returncode == 0, q.stderr
    assert json.loads(q.stdout) == [{"lr": "0.05", "n": 1}, {"lr": "0.1", "n": 2},
                                    {"lr": None, "n": 1}]


@pytest.mark.parametrize("n", [3, 60])
def test_the_report_shows_them(tmp_path: Path, n: int) -> None:
    run = _run(tmp_path, "a", {f"k{i:02d}": i for i in range(n)} | {"note": "<b>x</b>"})
    out = subprocess.run([*CLI, "report", str(run), "-o", str(tmp_path / "r.html")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, 1), out.stderr
    page = (tmp_path / "r.html").read_text()
    assert 'id="hparams-table"' in page and 'href="#hparams-section"' in page
    assert "<td>k02</td><td>2</td><td>int</td>" in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page  # escaped
    # a long list starts folded
    assert ('ev-table" open><summary>' in page.split('id="hparams-section"')[1][:600]) == (
        n + 1 <= 40)
