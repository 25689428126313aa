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
import time
from pathlib import Path
from typing import Any

import pytest

from tests.matrix.pathologies import OPEN, PATHOLOGIES, STEP_TOLERANCE, applies
from tests.matrix.runner import REPO_ROOT, _env, run_dir_of
from tests.matrix.zoo import ALL as MODELS
from tests.scenarios import checks

# (the first test records the suite's slice in its session fixture: about a minute on 2 cores;
# the whole matrix, ~6.5 minutes, is benchmarks/matrix.py or TRACEALYZE_FULL_MATRIX=1)
# one xdist worker records the slice once (a session fixture runs per worker)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.xdist_group("matrix")]

# the leak first: its process's allocator must not have grown for other reasons before it;
# the second leak (leak_list) in a process of its own for the same reason
ORDER = sorted(PATHOLOGIES, key=lambda p: (p != "leak", list(PATHOLOGIES).index(p)))
ALONE = ("leak_list",)
ALL_CASES = [(m, p) for m in MODELS for p in ORDER if applies(m, MODELS[m], p)]
"""Every cell: benchmarks/matrix.py records them all (seeds 0-4) for README's rates table."""


def slice_cases() -> list[tuple[str, str]]:
    """The suite's slice of the matrix (issue 43: the suite in 10 minutes): every architecture
    and every pathology cell at least once. Each model keeps its ``healthy`` run (a false
    alarm on any architecture is caught, and ``manifested`` compares a pathology with the
    healthy run of its model); each other cell goes to the applicable model that has the
    fewest cells so far, scanning the models from a place that moves with the cell, so the
    cells spread over the architectures instead of piling on the first ones."""
    chosen = {(m, "healthy") for m in MODELS}
    load = dict.fromkeys(MODELS, 1)
    names = list(MODELS)
    for i, p in enumerate(q for q in ORDER if q != "healthy"):
        fits = [m for m in names[i % len(names):] + names[:i % len(names)]
                if applies(m, MODELS[m], p)]
        m = min(fits, key=lambda x: load[x])  # (min keeps the first of equals: the scan)
        chosen.add((m, p))
        load[m] += 1
    return [c for c in ALL_CASES if c in chosen]


CASES = [c for c in (ALL_CASES if os.environ.get("TRACEALYZE_FULL_MATRIX") else slice_cases())
         if c[1] not in OPEN]
"""What the suite records and judges: the slice, or every cell with
``TRACEALYZE_FULL_MATRIX=1``; not the cells still OPEN (benchmarks/matrix.py judges those)."""


def jobs(seed: int = 0, cases: list[tuple[str, str]] | None = None) -> list[list[str]]:
    """Runner arguments, one list per process: per model, the leak first and every other
    cell of ``cases`` (default: every cell); then each of ALONE by itself."""
    picked = set(ALL_CASES if cases is None else cases)
    out, alone = [], []
    for m in MODELS:
        cells = [p for p in ORDER if applies(m, MODELS[m], p) and (m, p) in picked]
        if not cells:
            continue
        tag = f":{seed}" if seed else ""
        out.append([f"{m}:{p}{tag}" for p in cells if p not in ALONE])
        alone += [[f"{m}:{p}{tag}"] for p in cells if p in ALONE]
    return out + alone  # the long processes first: the short ones fill the gaps at the end


@pytest.fixture(scope="session")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("matrix")
    # one recording process per core (each trains on one thread), at least two
    failures = run_jobs(root, jobs(0, CASES), parallel=max(2, min(4, os.cpu_count() or 2)))
    assert not failures, "\n".join(failures)
    return root


def run_jobs(root: Path, todo: list[list[str]], parallel: int = 2) -> list[str]:
    """Record ``todo`` (runner argument lists), ``parallel`` processes at a time, starting the
    next as soon as any one ends (a model's 20 cells take ~70 s, a lone leak cell ~10 s:
    waiting for the oldest left a core idle); the failures, with their output's tail. Each
    process writes its output to a log file (a pipe left unread could fill and block it)."""
    pending = list(todo)
    running: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    failures = []
    while pending or running:
        while pending and len(running) < parallel:
            cells = pending.pop(0)
            name = cells[0].replace(":", "-")
            log = root / f"{name}.log"
            args = [sys.executable, "-m", "tests.matrix.runner", str(root), *cells]
            with log.open("wb") as out:
                proc = subprocess.Popen(args, cwd=REPO_ROOT, env=_env(), stdout=out,
                                        stderr=subprocess.STDOUT)
            running.append((name, proc, log))
        done = [r for r in running if r[1].poll() is not None]
        if not done:
            time.sleep(0.1)
            continue
        for name, proc, log in done:
            running.remove((name, proc, log))
            if proc.returncode != 0:
                text = log.read_bytes().decode(errors="replace")
                failures.append(f"{name}: exit {proc.returncode}\n{text[-3000:]}")
    return failures


HARM = 0.5
"""A must_show pathology did harm when its run's final loss gave back at least this share
of what the healthy run of the same model and seed learned (or went nonfinite)."""


def _loss_levels(run: Path) -> tuple[float, float, bool] | None:
    """(start, end, ever nonfinite) of a run's loss: medians of its first and last 10%."""
    import duckdb

    files = sorted(str(p) for p in run.glob("steps/**/*.parquet"))
    if not files:
        return None
    loss = [r[0] for r in duckdb.connect().execute(
        "SELECT loss FROM read_parquet(?) ORDER BY step", [files]).fetchall()]
    if len(loss) < 20:
        return None
    import math
    import statistics

    k = len(loss) // 10
    bad = any(v is None or not math.isfinite(v) for v in loss)
    fin = [v for v in loss if v is not None and math.isfinite(v)]
    return statistics.median(fin[:k]), statistics.median(fin[-k:] or fin), bad


def manifested(pathology: str, run: Path) -> bool:
    """Whether a must_show pathology visibly harmed training, against the healthy run of
    the same model and seed beside it (the data says, not the detectors)."""
    if not PATHOLOGIES[pathology].must_show:
        return True
    healthy = run.parent / run.name.replace(f"-{pathology}", "-healthy", 1)
    mine, base = _loss_levels(run), _loss_levels(healthy)
    if mine is None or base is None:
        return True
    if mine[2]:
        return True
    learned = base[0] - base[1]
    return mine[1] - base[1] >= HARM * learned


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
    words = truth.mentions + (truth.mentions_if(MODELS[model]) if truth.mentions_if else ())
    problems += [f"does not mention {w!r}" for w in words if w not in text]
    return problems


@pytest.mark.parametrize(("model", "pathology"), CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_matrix(matrix: Path, model: str, pathology: str) -> None:
    run = run_dir_of(matrix, model, pathology)
    if not manifested(pathology, run):
        pytest.skip(f"{pathology} did no visible harm to {model} (final loss within "
                    f"{HARM:.0%} of what the healthy run learned): nothing to find")
    summary = checks.summarize(run)
    assert summary["run"]["status"] == "completed"
    problems = judge(model, pathology, summary, run)
    (run / "verdict.json").write_text(json.dumps(problems))
    assert not problems, f"{model}/{pathology}: {problems}\n{checks.describe(summary)}"


def test_matrix_rates_table(matrix: Path) -> None:
    """The README's false-alarm and detection rates, recomputed from this session's runs
    (written to tests/_artifacts/matrix_rates.md; the test fails only if a run is missing)."""
    from tests.matrix.rates import rates_table

    table = rates_table(matrix, reuse_verdicts=True)
    out = REPO_ROOT / "tests" / "_artifacts" / "matrix_rates.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    assert f"| healthy | {len(MODELS)} |" in table and os.path.getsize(out) > 0


def test_open_cells_are_matrix_cells_with_a_reason() -> None:
    # an OPEN entry names a cell that exists and says where it stands; one that no longer
    # exists (renamed, met and removed from PATHOLOGIES) must go from OPEN too
    assert set(OPEN) <= set(PATHOLOGIES)
    assert all(reason.startswith("#") for reason in OPEN.values())

