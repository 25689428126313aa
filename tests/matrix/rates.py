"""False-alarm and detection rates of the analyzer on a recorded matrix (README figures):
``python -m tests.matrix.rates MATRIX_ROOT`` prints the markdown table."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.matrix.models import MODELS
from tests.matrix.pathologies import PATHOLOGIES
from tests.matrix.runner import run_dir_of
from tests.scenarios import checks


def rates_table(root: Path) -> str:
    from tests.matrix.test_matrix import judge

    lines = ["| pathology | runs | right | rate | misses |", "|---|---|---|---|---|"]
    for p in PATHOLOGIES:
        ok, misses = 0, []
        for m in MODELS:
            run = run_dir_of(root, m, p)
            problems = judge(m, p, checks.summarize(run), run)
            if problems:
                misses.append(f"{m}: {'; '.join(problems)}")
            else:
                ok += 1
        n = len(MODELS)
        lines.append(f"| {p} | {n} | {ok} | {100 * ok / n:.0f}% | "
                     f"{'<br>'.join(misses) or '–'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(rates_table(Path(sys.argv[1])))
