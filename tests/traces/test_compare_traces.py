"""tracealyze compare on profiler traces: a `.item()` added to every step of a real trace (HTA's
sampled NCCL trace, 2 profiled steps) must show in the kernel/op diff as the added host sync,
per profiled step, and as a host_sync regression; identical traces show no difference."""

from __future__ import annotations

from pathlib import Path

import pytest
from trace_helpers import ITEMS_PER_STEP, SAMPLED, with_items
from tracealyze.analyzer.compare.runs import compare_runs, render_text
from tracealyze.analyzer.ingest.importer import import_traces


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cmp")
    base, new = root / "base", root / "new"
    import_traces([SAMPLED], base)
    import_traces([with_items(SAMPLED, root / "items.json")], new)
    return base, new


def rows(result: dict, kind: str, name: str) -> dict:
    (r,) = [r for r in result["kernels"]["rows"] if r["kind"] == kind and r["name"] == name]
    return r


def test_added_item_shows_in_the_diff_per_profiled_step(runs: tuple[Path, Path]) -> None:
    base, new = runs
    r = compare_runs(base, new)
    k = r["kernels"]
    assert k["unit"] == "profiled step" and k["base_windows"] == k["new_windows"] == 2
    item = rows(r, "op", "aten::item")
    assert item["new_count_per_step"] - item["base_count_per_step"] == ITEMS_PER_STEP
    assert item["status"] in ("added", "more_calls", "slower")
    sync = rows(r, "runtime", "cudaStreamSynchronize")
    assert sync["new_count_per_step"] - sync["base_count_per_step"] == ITEMS_PER_STEP
    # ~4.35 ms per step more blocked on the host, joined with the profiled steps' own span
    assert sync["delta_us_per_step"] == pytest.approx(ITEMS_PER_STEP * 1450.0)
    assert sync["status"] == "added"  # the base trace never synchronizes a stream
    d2h = rows(r, "kernel", "Memcpy DtoH (Device -> Pageable)")
    assert d2h["new_count_per_step"] - d2h["base_count_per_step"] == ITEMS_PER_STEP
    # the sync is the largest runtime change, and the finding says what it is
    runtime = [x for x in k["rows"] if x["kind"] == "runtime"]
    assert runtime[0]["name"] == "cudaStreamSynchronize"
    launches = next(m for m in r["metrics"] if m["name"] == "kernel_launches_per_step")
    assert launches["new"] - launches["base"] == ITEMS_PER_STEP
    assert launches["significant"]  # the same count every step: beyond the 2 steps' spread
    assert "host_sync" in {f["id"] for f in r["findings"]["new"] + r["findings"]["worse"]}
    assert r["verdict"] in ("regressed", "mixed")
    text = render_text(r)
    assert "aten::item" in text and "cudaStreamSynchronize" in text
    # the reverse: the same calls are gone
    back = compare_runs(new, base)
    assert rows(back, "runtime", "cudaStreamSynchronize")["delta_us_per_step"] < 0


def test_identical_traces_show_no_difference(runs: tuple[Path, Path]) -> None:
    base, _ = runs
    r = compare_runs(base, base)
    assert r["kernels"]["rows"] == [] and r["verdict"] == "unchanged"
    assert r["gpu_time"]["base"] == r["gpu_time"]["new"]
    assert r["gpu_time"]["base"]["total_us"] > 0


def test_only_one_run_with_traces_is_a_warning_not_an_error(runs: tuple[Path, Path],
                                                            tmp_path: Path) -> None:
    from tests.runfactory import make_run

    plain = make_run(tmp_path, name="plain", steps=50)
    r = compare_runs(plain, runs[0])
    assert r["kernels"] is None and r["gpu_time"] is None
    assert any("only the new run has GPU profiler traces" in w for w in r["warnings"])
