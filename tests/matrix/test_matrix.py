"""The real-model matrix: every architecture in models.MODELS × every pathology in
pathologies.PATHOLOGIES, recorded with the real Recorder and judged by the real analyzer.

Acceptance (issue #13): no finding above info on any healthy run; every pathology found as
the top-ranked root cause (the summary's first finding) with the right subject and its
first step within ±STEP_TOLERANCE of the truth. All runs are recorded once per session, one
fresh interpreter per model (two at a time): a leak is only a leak in a process whose
allocator has not already grown for other reasons.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.matrix.models import MODELS
from tests.matrix.pathologies import PATHOLOGIES, STEP_TOLERANCE
from tests.matrix.runner import REPO_ROOT, _env, run_dir_of
from tests.scenarios import checks

pytestmark = pytest.mark.slow

# the leak first: its process's allocator must not have grown for other reasons before it
ORDER = sorted(PATHOLOGIES, key=lambda p: (p != "leak", list(PATHOLOGIES).index(p)))
CASES = [(m, p) for m in MODELS for p in ORDER]


@pytest.fixture(scope="session")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("matrix")
    pending = list(MODELS)
    running: list[tuple[str, subprocess.Popen[bytes]]] = []
    failures = []
    while pending or running:
        while pending and len(running) < 2:
            m = pending.pop(0)
            args = [sys.executable, "-m", "tests.matrix.runner", str(root),
                    *(f"{m}:{p}" for p in ORDER)]
            running.append((m, subprocess.Popen(args, cwd=REPO_ROOT, env=_env(),
                                                stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT)))
        m, proc = running.pop(0)
        out, _ = proc.communicate(timeout=900)
        (root / f"{m}.log").write_bytes(out)
        if proc.returncode != 0:
            failures.append(f"{m}: exit {proc.returncode}\n{out.decode()[-3000:]}")
    assert not failures, "\n".join(failures)
    return root


def judge(model: str, pathology: str, summary: dict[str, Any], run: Path) -> list[str]:
    """What is wrong with the analyzer's verdict on one matrix run (empty: right)."""
    truth = PATHOLOGIES[pathology].truth
    problems = []
    if not truth.ids:
        extra = checks.unexpected(summary, run)
        if extra:
            problems.append("healthy run has findings above info")
        return problems
    findings = summary["findings"]
    if not findings or findings[0]["severity"] == "info":
        return [f"no finding above info (expected {truth.ids})"]
    top = findings[0]
    if top["id"] not in truth.ids:
        problems.append(f"top-ranked root cause is {top['id']}, expected one of {truth.ids}")
    if truth.subject is not None:
        want = truth.subject(MODELS[model])
        if top["subject"] not in ((want,) if isinstance(want, str) else want):
            problems.append(f"subject {top['subject']!r}, expected {want!r}")
    if truth.step is not None and (top["first_step"] is None or
                                   abs(top["first_step"] - truth.step) > STEP_TOLERANCE):
        problems.append(f"first_step {top['first_step']}, expected {truth.step}±"
                        f"{STEP_TOLERANCE}")
    text = (top["title"] + " " + top["message"]).lower()
    problems += [f"does not mention {w!r}" for w in truth.mentions if w not in text]
    return problems


@pytest.mark.parametrize(("model", "pathology"), CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_matrix(matrix: Path, model: str, pathology: str) -> None:
    run = run_dir_of(matrix, model, pathology)
    summary = checks.summarize(run)
    assert summary["run"]["status"] == "completed"
    problems = judge(model, pathology, summary, run)
    (run / "verdict.json").write_text(json.dumps(problems))
    assert not problems, f"{model}/{pathology}: {problems}\n{checks.describe(summary)}"


def test_matrix_rates_table(matrix: Path) -> None:
    """The README's false-alarm and detection rates, recomputed from this session's runs
    (written to tests/_artifacts/matrix_rates.md; the test fails only if a run is missing)."""
    from tests.matrix.rates import rates_table

    table = rates_table(matrix)
    out = REPO_ROOT / "tests" / "_artifacts" / "matrix_rates.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    assert f"| healthy | {len(MODELS)} |" in table and os.path.getsize(out) > 0
