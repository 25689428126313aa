"""``report_to="mlflow"`` / ``"wandb"``: at close, the run's findings (tags and a JSON
artifact) and its ``report.html`` are attached to the MLflow or wandb run of the script,
where the team already looks.

The analysis runs in a subprocess (``tracealyze summary`` and ``report``): the recorder
never imports the analyzer (DuckDB, jinja2) into a training process, and an analysis that
fails or hangs cannot break the training script's end. MLflow and wandb are imported only
when asked for. The MLflow run is the one active when the Recorder started (or at close):
a framework's own MLflow callback may end its run before ours closes, and an ended run
still takes tags and artifacts. wandb needs its run still open at close.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..config import report_targets as parse

_CLI = [sys.executable, "-c", "from tracealyze.analyzer.cli import main; main()"]


def tags_of(summary: dict[str, Any]) -> dict[str, str]:
    """The tags a finding-aware dashboard filters on."""
    from tracealyze.format.vocabulary import SEVERITIES

    found = [f for f in summary.get("findings", []) if f.get("severity") != "info"]
    worst = max((f["severity"] for f in found), key=SEVERITIES.index, default="none")
    top = next((f for f in found if f["severity"] == worst), None)
    return {"tracealyze.run_id": str(summary.get("run", {}).get("run_id", "")),
            "tracealyze.status": str(summary.get("run", {}).get("status", "")),
            "tracealyze.worst_severity": worst,
            "tracealyze.top_finding": top["id"] if top else "none",
            "tracealyze.findings": ",".join(sorted({f["id"] for f in found}))[:4000] or "none"}


class Reporter:
    """Created with the Recorder (rank 0): remembers the MLflow run active then."""

    def __init__(self, targets: tuple[str, ...]) -> None:
        self.targets = targets
        self.mlflow_run_id: str | None = None
        mlflow = sys.modules.get("mlflow")  # (imported by the script: never by us here)
        if "mlflow" in targets and mlflow is not None:
            active = mlflow.active_run()
            self.mlflow_run_id = active.info.run_id if active is not None else None

    @classmethod
    def of(cls, value: str | None, rank: int) -> Reporter | None:
        """The reporter of ``report_to`` on ``rank`` (rank 0 reports; None otherwise)."""
        return cls(parse(value)) if value and rank == 0 else None

    def close(self, run_dir: str) -> None:
        """Publish, saying each problem on stderr (one line each); never raises."""
        try:
            problems = self.publish(run_dir)
        except Exception as e:
            problems = [f"{type(e).__name__}: {e}"]
        for p in problems:
            print(f"tracealyze: report_to: {p}", file=sys.stderr)

    def publish(self, run_dir: str, timeout_s: float = 600.0) -> list[str]:
        """Analyse ``run_dir`` and attach the result to each target; the problems, one line
        each (said on stderr by the caller: the run itself is complete whatever happens)."""
        problems: list[str] = []
        with tempfile.TemporaryDirectory(prefix="tracealyze-report-to-") as td:
            summary_file, report = Path(td) / "tracealyze-summary.json", Path(td) / "report.html"
            try:
                out = subprocess.run([*_CLI, "summary", run_dir, "--json"], text=True,
                                     capture_output=True, timeout=timeout_s)
                if out.returncode != 0:
                    return [f"cannot analyse the run: {out.stderr.strip()[-300:]}"]
                summary = json.loads(out.stdout)
                summary_file.write_text(out.stdout)
                rep = subprocess.run([*_CLI, "report", run_dir, "-o", str(report)],
                                     capture_output=True, timeout=timeout_s)
                if rep.returncode != 0:
                    problems.append("report.html not written: "
                                    f"{rep.stderr.decode(errors='replace').strip()[-300:]}")
            except (OSError, ValueError, subprocess.TimeoutExpired) as e:
                return [f"cannot analyse the run: {type(e).__name__}: {e}"]
            files = [summary_file] + ([report] if report.exists() else [])
            for target in self.targets:
                try:
                    (self._mlflow if target == "mlflow" else self._wandb)(summary, files)
                except Exception as e:  # their library, their failure: never ours to raise
                    problems.append(f"{target}: {type(e).__name__}: {e}")
        return problems

    def _mlflow(self, summary: dict[str, Any], files: list[Path]) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        active = mlflow.active_run()
        run_id = active.info.run_id if active is not None else self.mlflow_run_id
        if run_id is None:
            raise RuntimeError("no MLflow run was active (mlflow.start_run() first)")
        client = MlflowClient()
        for k, v in tags_of(summary).items():
            client.set_tag(run_id, k, v)
        for f in files:
            client.log_artifact(run_id, str(f), artifact_path="tracealyze")

    def _wandb(self, summary: dict[str, Any], files: list[Path]) -> None:
        import wandb

        run = wandb.run
        if run is None:
            raise RuntimeError("no wandb run is active at close (wandb.init() first, and "
                               "finish it after the Recorder closes)")
        tags = tags_of(summary)
        for k, v in tags.items():
            run.summary[k] = v
        run.tags = tuple(dict.fromkeys([*(run.tags or ()), *(
            f"tracealyze:{i}" for i in tags["tracealyze.findings"].split(",") if i != "none")]))
        art = wandb.Artifact(f"tracealyze-{tags['tracealyze.run_id'] or 'run'}",
                             type="tracealyze")
        for f in files:
            art.add_file(str(f))
            # and in the run's Files, where report.html opens from the run's page
            run.save(str(f), base_path=str(f.parent), policy="now")
        run.log_artifact(art)
