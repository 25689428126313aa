"""report_to="mlflow" / "wandb": at close, the findings (tags and a JSON artifact) and
report.html land on the script's MLflow run (its local file store) or wandb run (offline
mode), for a real training loop whose loss goes NaN; neither library is imported unless
asked for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rec_helpers import FAST
from torch import nn
from tracealyze.recorder import Recorder


def _train_to_nan(run_dir: Path, **knobs: object) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with Recorder(run_dir, model=model, optimizer=opt, **FAST, **knobs) as rec:
        for step in range(60):
            x = torch.randn(16, 8) * (1e30 if step >= 40 else 1.0)  # overflow from step 40
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)


def test_findings_and_report_on_the_mlflow_run(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    mlflow = pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # (the local file store)
    with mlflow.start_run() as active:
        _train_to_nan(tmp_path / "run", report_to="mlflow")
    run = MlflowClient().get_run(active.info.run_id)
    tags = run.data.tags
    assert tags["tracealyze.worst_severity"] == "critical"
    assert "nonfinite" in tags["tracealyze.findings"].split(",")
    assert tags["tracealyze.run_id"] == json.loads((tmp_path / "run" / "run.json")
                                                   .read_text())["run_id"]
    names = {a.path for a in MlflowClient().list_artifacts(active.info.run_id, "tracealyze")}
    assert names == {"tracealyze/tracealyze-summary.json", "tracealyze/report.html"}
    local = MlflowClient().download_artifacts(active.info.run_id,
                                              "tracealyze/tracealyze-summary.json",
                                              str(tmp_path / "dl"))
    ids = [f["id"] for f in json.loads(Path(local).read_text())["findings"]]
    assert "nonfinite" in ids


def test_an_mlflow_run_ended_before_the_recorder_closed_still_gets_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A framework's MLflow callback may end its run first: the run active when the
    Recorder started is the one tagged."""
    mlflow = pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # (the local file store)
    active = mlflow.start_run()
    rec = Recorder(tmp_path / "run", model=nn.Linear(2, 1), report_to="mlflow", **FAST)
    rec.step(loss=torch.tensor(1.0))
    mlflow.end_run()
    rec.close()
    assert MlflowClient().get_run(active.info.run_id).data.tags[
        "tracealyze.worst_severity"] in ("none", "info", "warning", "error", "critical")


def test_findings_and_report_on_the_wandb_run(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    run = wandb.init(project="tracealyze-test", dir=str(tmp_path))
    try:
        _train_to_nan(tmp_path / "run", report_to="wandb")
        assert run.summary["tracealyze.worst_severity"] == "critical"
        assert "tracealyze:nonfinite" in run.tags
    finally:
        run.finish()
    # copied into the run's files (synced with it; report.html opens from the run page)
    files = {p.name for p in Path(run.dir).iterdir()}
    assert {"tracealyze-summary.json", "report.html"} <= files


def test_a_bad_target_is_refused_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="report_to must be"):
        Recorder(tmp_path / "run", model=nn.Linear(2, 1), report_to="tensorboard")


def test_without_report_to_neither_library_is_imported(tmp_path: Path) -> None:
    code = (f"import sys, torch\nfrom tracealyze.recorder import Recorder\n"
            f"with Recorder({str(tmp_path / 'run')!r}, model=torch.nn.Linear(2, 1),"
            f" flush_interval_s=0.2) as r:\n    r.step(loss=torch.tensor(1.0))\n"
            f"print(sorted(m for m in ('mlflow', 'wandb') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("module", ["hf", "lightning"])
def test_both_callbacks_take_report_to(tmp_path: Path, module: str) -> None:
    pytest.importorskip("transformers" if module == "hf" else "lightning")
    import importlib

    cls = importlib.import_module(f"tracealyze.recorder.integrations.{module}").TracealyzeCallback
    assert cls(tmp_path / "run", report_to="mlflow") is not None
    with pytest.raises(ValueError, match="report_to must be"):
        cls(tmp_path / "run", report_to="comet")
