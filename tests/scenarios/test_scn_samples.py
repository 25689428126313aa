"""The committed sample_traces/ runs show what sample_traces/README.md says they show."""

from __future__ import annotations

import pytest

from tests.scenarios import checks
from tests.scenarios import generate_samples as G


@pytest.mark.parametrize("name", sorted(G.SAMPLES))
def test_sample_has_its_findings(name: str) -> None:
    run_dir = G.OUT / name
    assert (run_dir / "run.json").is_file(), \
        f"missing sample; regenerate with: python -m tests.scenarios.generate_samples {name}"
    # the killed run is read as it is read later: its heartbeat is old
    stale = 0.001 if name == "killed" else None
    assert G.check(name, run_dir, killed_stale_s=stale) == []


def test_healthy_sample_is_healthy_and_has_a_profiler_trace() -> None:
    run_dir = G.OUT / "healthy"
    summary = checks.summarize(run_dir)
    assert summary["run"]["status"] == "completed"
    assert not checks.above(summary), checks.describe(summary)
    assert list((run_dir / "traces" / "rank=0").glob("*.pt.trace.json.gz"))
    # the profiler section of the report has data: trace events are ingested
    code, out = checks.cli("query", str(run_dir), "SELECT count(*) AS n FROM trace_events",
                           "--format", "csv")
    assert code == 0 and int(out.split()[-1]) > 0


def test_samples_fit_the_size_budget() -> None:
    total = sum(G.size_of(G.OUT / n) for n in G.SAMPLES)
    assert total <= G.SIZE_BUDGET_BYTES
