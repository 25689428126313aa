"""Record the unseen training scripts and judge what the analyzer says about them.

The scripts in ``tests/unseen/scripts/`` were written by people who had not read the
detectors (issue 45: "write the rule, not the case"). Each is a self-contained CPU training
loop that records with ``tracealyze.recorder.Recorder`` into ``--run-dir`` and states what is
true of it in a module-level literal ``EXPECT``::

    EXPECT = {
        "healthy": False,                 # True: nothing above info may be found
        "findings": [                     # each must be found above info
            {"id": "gradient_explosion", "first_step": 0, "tolerance": 1,
             "top": True,                 # optional: the first finding of the summary
             "subject": "rnn.weight_hh_l0"},   # optional: substring of the subject
        ],
        "forbidden": ["loss_divergence"],  # optional: ids that must not be above info
    }

    python tests/unseen/run_unseen.py --out tests/unseen/verdicts-before.json [NAME...]

Verdicts are kept as they were written (``verdicts-*.json``); a later run writes a new file,
so the rate before and after a detector change can be compared.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"


def expectation(script: Path) -> dict[str, Any]:
    """The script's ``EXPECT`` literal, read without running the script."""
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "EXPECT" for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"{script.name}: no EXPECT")


def judge(expect: dict[str, Any], summary: dict[str, Any]) -> tuple[bool, list[str]]:
    """(passed, reasons it did not)."""
    above = [f for f in summary["findings"] if f["severity"] != "info"]
    why: list[str] = []
    if expect.get("healthy"):
        why += [f"false alarm: {f['id']} ({f['severity']}) {f['title']}" for f in above]
    for want in expect.get("findings", []):
        hits = [f for f in above if f["id"] == want["id"]]
        if not hits:
            why.append(f"missed: {want['id']}")
            continue
        f = hits[0]
        if want.get("top") and above and above[0]["id"] != want["id"]:
            why.append(f"{want['id']} not first (first: {above[0]['id']})")
        if "first_step" in want:
            tol = want.get("tolerance", 1)
            if f["first_step"] is None or abs(f["first_step"] - want["first_step"]) > tol:
                why.append(f"{want['id']} dated {f['first_step']}, expected "
                           f"{want['first_step']}±{tol}")
        if want.get("subject") and want["subject"] not in str(f.get("subject")):
            why.append(f"{want['id']} subject {f.get('subject')!r}, expected "
                       f"{want['subject']!r}")
    for fid in expect.get("forbidden", []):
        why += [f"forbidden: {f['id']} {f['title']}" for f in above if f["id"] == fid]
    return not why, why


def run_one(script: Path, root: Path, timeout: float, record: bool = True) -> dict[str, Any]:
    from tracealyze.analyzer.diagnosis.summary import build_summary

    run_dir = root / script.stem
    t0 = time.time()
    err = ""
    if record:
        proc = subprocess.run([sys.executable, str(script), "--run-dir", str(run_dir)],
                              capture_output=True, text=True, timeout=timeout)
        err = f"exit {proc.returncode}: {proc.stderr[-500:]}"
    out: dict[str, Any] = {"seconds": round(time.time() - t0, 1)}
    if record and proc.returncode != 0 and "already holds a run" in proc.stderr:
        # (never judge an earlier recording as if it were this one)
        return {**out, "passed": False, "why": [f"not recorded: {run_dir} holds a run"]}
    if not (run_dir / "run.json").exists():
        return {**out, "passed": False, "why": [f"no run recorded ({err})"]}
    summary = build_summary(run_dir)
    passed, why = judge(expectation(script), summary)
    return {**out, "passed": passed, "why": why,
            "findings": [{k: f[k] for k in ("id", "severity", "first_step", "subject", "title")}
                         for f in summary["findings"]]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", help="script names (default: all)")
    ap.add_argument("--out", type=Path, required=True, help="verdicts JSON to write")
    ap.add_argument("--root", type=Path, default=None, help="where runs go (default: temp)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--judge-only", action="store_true",
                    help="judge the runs already under --root (after an analyzer change)")
    args = ap.parse_args()
    if args.judge_only and args.root is None:
        ap.error("--judge-only needs --root")
    scripts = sorted(p for p in SCRIPTS.glob("*.py")
                     if not args.names or p.stem in args.names)
    root = args.root or Path(tempfile.mkdtemp(prefix="unseen-"))
    verdicts = {}
    for s in scripts:
        verdicts[s.stem] = v = run_one(s, root, args.timeout, record=not args.judge_only)
        print(f"{'PASS' if v['passed'] else 'FAIL'}  {s.stem}  ({v['seconds']} s)"
              + "".join(f"\n      {w}" for w in v["why"]), flush=True)
    n = sum(v["passed"] for v in verdicts.values())
    print(f"{n}/{len(verdicts)} passed")
    args.out.write_text(json.dumps({"passed": n, "total": len(verdicts),
                                    "verdicts": verdicts}, indent=1) + "\n")


if __name__ == "__main__":
    main()
