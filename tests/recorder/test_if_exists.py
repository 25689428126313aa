"""A second run of the same script (issue 46): ``Recorder(run_dir)`` refuses a directory that
holds a run (DESIGN.md; ``resume=True`` appends), ``if_exists="new"`` records beside it
(``exp1-2``, ``exp1-3``, ...) and names the new directory on stderr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from tracealyze.recorder import Recorder


def _train(run_dir: Path | str, steps: int = 3, **kw) -> Recorder:
    model = nn.Linear(4, 1)
    with Recorder(run_dir, model=model, preset="minimal", **kw) as rec:
        for _ in range(steps):
            rec.step(loss=model(torch.randn(2, 4)).sum())
    return rec


def test_new_records_beside_an_earlier_run_and_names_it(tmp_path: Path, capsys) -> None:
    first = _train(tmp_path / "exp1", steps=2)
    run_id = json.loads((tmp_path / "exp1" / "run.json").read_text())["run_id"]
    second = _train(tmp_path / "exp1", steps=3, if_exists="new")
    third = _train(tmp_path / "exp1", steps=4, if_exists="new")
    assert first.run_dir == tmp_path / "exp1"
    assert second.run_dir == tmp_path / "exp1-2" and third.run_dir == tmp_path / "exp1-3"
    err = capsys.readouterr().err
    assert f"recording this one to {tmp_path / 'exp1-2'}" in err
    # the earlier run is untouched; each new one is a run of its own
    assert json.loads((tmp_path / "exp1" / "run.json").read_text())["run_id"] == run_id
    ids = {json.loads((tmp_path / d / "run.json").read_text())["run_id"]
           for d in ("exp1", "exp1-2", "exp1-3")}
    assert len(ids) == 3
    assert json.loads((tmp_path / "exp1-3" / "run.json").read_text())["status"] == "completed"


def test_new_on_a_fresh_directory_uses_it(tmp_path: Path, capsys) -> None:
    rec = _train(tmp_path / "fresh", if_exists="new")
    assert rec.run_dir == tmp_path / "fresh"
    assert "already holds" not in capsys.readouterr().err


def test_default_still_refuses_and_says_how(tmp_path: Path) -> None:
    _train(tmp_path / "exp1")
    with pytest.raises(ValueError, match=r"if_exists='new'.*new run beside"):
        _train(tmp_path / "exp1")


@pytest.mark.parametrize(("run_dir", "kw", "match"), [
    ("exp", {"if_exists": "overwrite"}, "if_exists must be 'error' or 'new'"),
    ("exp", {"if_exists": "new", "resume": True}, "pass one of them"),
    ("s3://bucket/exp", {"if_exists": "new"}, "needs a local run_dir"),
])
def test_bad_combinations_are_refused_at_construction(tmp_path: Path, run_dir: str,
                                                      kw: dict, match: str) -> None:
    target = run_dir if "://" in run_dir else tmp_path / run_dir
    with pytest.raises(ValueError, match=match):
        Recorder(target, model=nn.Linear(2, 1), **kw)
    assert not (tmp_path / "exp").exists()
