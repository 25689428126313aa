"""False-alarm and detection rates of the analyzer on recorded matrix runs (README figures).

    python -m tests.matrix.rates ROOT [ROOT ...]

prints the markdown table over every ``<model>-<pathology>[-s<seed>]`` run directory under the
roots (the test session's matrix, plus any extra seeds recorded with
``python -m tests.matrix.runner ROOT model:pathology:seed ...``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from tests.matrix.pathologies import PATHOLOGIES
from tests.matrix.zoo import ALL as MODELS
from tests.scenarios import checks

_NAME = re.compile(r"^(?P<model>[a-z0-9]+)-(?P<pathology>[a-z0-9_]+?)(?:-s(?P<seed>\d+))?$")


def runs(*roots: Path) -> list[tuple[str, str, Path]]:
    out = []
    for root in roots:
        for d in sorted(Path(root).iterdir()):
            m = _NAME.match(d.name)
            if d.is_dir() and m and m["model"] in MODELS and m["pathology"] in PATHOLOGIES:
                out.append((m["model"], m["pathology"], d))
    return out


def rates_table(*roots: Path, reuse_verdicts: bool = False) -> str:
    """The table over every run under ``roots``, each judged by the current analyzer;
    ``reuse_verdicts``: take a run's ``verdict.json`` where this session's test_matrix wrote
    one (the suite: the 273 summaries are not computed twice)."""
    from tests.matrix.test_matrix import judge, manifested

    found = runs(*roots)
    lines = ["| pathology | runs | right | rate | no harm done | misses |",
             "|---|---|---|---|---|---|"]
    for p in PATHOLOGIES:
        mine = [(m, d) for m, q, d in found if q == p]
        harmless = [d.name for _, d in mine if not manifested(p, d)]
        mine = [(m, d) for m, d in mine if d.name not in harmless]
        if not mine:
            continue
        misses = []
        for m, d in mine:
            verdict = d / "verdict.json"
            problems = (json.loads(verdict.read_text()) if reuse_verdicts and verdict.exists()
                        else judge(m, p, checks.summarize(d), d))
            if problems:
                misses.append(f"{d.name}: {'; '.join(problems)}")
        ok = len(mine) - len(misses)
        lines.append(f"| {p} | {len(mine)} | {ok} | {100 * ok / len(mine):.0f}% | "
                     f"{len(harmless) or '–'} | {'<br>'.join(misses) or '–'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(rates_table(*(Path(a) for a in sys.argv[1:])))
