"""tracealyze compare: scenario pairs whose verdict is known, the significance test, the
JSON contract (DESIGN.md "Comparing runs"), comparability warnings and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import bad
from click.testing import CliRunner
from tracealyze.analyzer.cli import main
from tracealyze.analyzer.compare.runs import compare_runs
from tracealyze.analyzer.compare.stats import mann_whitney_p, shifted

from tests.runfactory import make_run


def metric(result: dict, name: str) -> dict:
    (m,) = [m for m in result["metrics"] if m["name"] == name]
    return m


def run_cli(*args: str):
    return CliRunner().invoke(main, list(map(str, args)))


def test_same_training_twice_is_unchanged(tmp_path: Path) -> None:
    # the same run with other noise draws (seed): no metric may call that a change
    a = make_run(tmp_path, name="a", steps=400, seed=1, tensors=4)
    b = make_run(tmp_path, name="b", steps=400, seed=2, tensors=4)
    r = compare_runs(a, b)
    assert r["verdict"] == "unchanged", r["regressions"] + r["improvements"]
    assert r["comparable"] and r["warnings"] == []
    assert run_cli("compare", a, b, "--fail-on", "regression").exit_code == 0


def test_slower_data_loader_is_a_regression_that_names_the_data_wait(tmp_path: Path) -> None:
    a = make_run(tmp_path, name="a", steps=300, seed=1)
    b = make_run(tmp_path, name="b", steps=300, seed=2, data_wait=0.08, duration=0.18)
    r = compare_runs(a, b)
    assert r["verdict"] == "regressed"
    assert {"data_wait_share", "step_time_median_s", "throughput_steps_per_s"} <= \
        set(r["regressions"])
    share = metric(r, "data_wait_share")
    assert share["significant"] and share["better"] == "lower" and share["new"] > 0.4
    assert [f["id"] for f in r["findings"]["new"]] == ["dataloader_bottleneck"]
    res = run_cli("compare", a, b, "--json", "--fail-on", "regression")
    assert res.exit_code == 1
    out = json.loads(res.output)
    # the DESIGN.md fields
    assert set(out) >= {"schema_version", "base", "new", "comparable", "warnings", "verdict",
                        "metrics", "findings"}
    assert set(out["findings"]) == {"new", "resolved", "worse"}
    for m in out["metrics"]:
        assert set(m) >= {"name", "base", "new", "change_pct", "better", "significant"}
    # the reverse direction is an improvement, and a huge threshold mutes the verdict
    assert compare_runs(b, a)["verdict"] == "improved"
    assert run_cli("compare", a, b, "--fail-on", "regression",
                   "--threshold", "1000000").exit_code == 1  # a new warning still counts


def test_higher_learning_rate_makes_the_loss_worse(tmp_path: Path) -> None:
    a = make_run(tmp_path, name="a", steps=300, seed=1,
                 loss=lambda s: 0.3 + 2.0 * np.exp(-s / 60))
    b = make_run(tmp_path, name="b", steps=300, seed=2,
                 loss=lambda s: 0.9 + 1.4 * np.exp(-s / 60))
    r = compare_runs(a, b)
    m = metric(r, "loss_final")
    assert m["significant"] and m["new"] > m["base"]
    assert "loss_final" in r["regressions"]


def test_a_leak_is_a_memory_regression(tmp_path: Path) -> None:
    a = make_run(tmp_path, name="a", steps=300, seed=1, rss=lambda s: 1e9 + 0 * s)
    b = make_run(tmp_path, name="b", steps=300, seed=2, rss=lambda s: 1e9 + 4e6 * s)
    r = compare_runs(a, b)
    assert metric(r, "memory_peak_rss_bytes")["significant"]
    assert metric(r, "memory_growth_rss_bytes_per_step")["significant"]
    assert {"memory_peak_rss_bytes", "memory_growth_rss_bytes_per_step"} <= \
        set(r["regressions"])


def test_stalls_show_as_more_step_time_outliers(tmp_path: Path) -> None:
    # every 20th step stalls 6x (a checkpoint, GC): the median barely moves, the outliers do
    rng = np.random.default_rng(0)
    steady = 0.1 * (1 + 0.02 * rng.standard_normal(400))
    stalls = np.where(np.arange(400) % 20 == 7, 0.6, steady)
    a = make_run(tmp_path, name="a", steps=400, seed=1, duration=steady)
    b = make_run(tmp_path, name="b", steps=400, seed=2, duration=stalls)
    r = compare_runs(a, b)
    m = metric(r, "step_time_outlier_share")
    assert m["base"] == 0 and m["new"] == pytest.approx(20 / 397, abs=0.005)
    assert m["significant"] and "step_time_outlier_share" in r["regressions"]
    assert "step_time_median_s" not in r["regressions"]
    # the same stalls in both runs: no change
    c = make_run(tmp_path, name="c", steps=400, seed=3, duration=stalls)
    assert not metric(compare_runs(b, c), "step_time_outlier_share")["significant"]


def test_fewer_outliers_under_a_slower_median_are_not_an_improvement(tmp_path: Path) -> None:
    # the base stalls every 20th step; the new run is 3x slower at every step, so none of
    # its steps stands out against its own (higher) median. Its tail is not faster: the
    # verdict is a regression, not "mixed".
    rng = np.random.default_rng(0)
    steady = 0.1 * (1 + 0.02 * rng.standard_normal(400))
    stalls = np.where(np.arange(400) % 20 == 7, 0.6, steady)
    a = make_run(tmp_path, name="a", steps=400, seed=1, duration=stalls)
    b = make_run(tmp_path, name="b", steps=400, seed=2, duration=3 * steady)
    r = compare_runs(a, b)
    share = metric(r, "step_time_outlier_share")
    assert share["significant"] and share["new"] < share["base"]
    assert r["verdict"] == "regressed", r["improvements"]
    assert "step_time_outlier_share" not in r["improvements"]
    # a faster median with new stalls is both: better and worse
    c = make_run(tmp_path, name="c", steps=400, seed=3, duration=3 * steady)
    assert compare_runs(c, a)["verdict"] == "mixed"


def test_nan_steps_and_a_layer_that_moved_by_orders_of_magnitude(tmp_path: Path) -> None:
    a = make_run(tmp_path, name="a", steps=200, seed=1, tensors=4)
    b = make_run(tmp_path, name="b", steps=200, seed=2, tensors=4,
                 nonfinite_grads=lambda s: (s >= 150).astype(int),
                 tensor_norm=lambda s, name, kind: np.full(len(s), 100.0 if name.endswith(
                     "0.weight") and kind == "grad" else 1.0))
    r = compare_runs(a, b)
    nf = metric(r, "loss_nonfinite_steps")
    assert nf["base"] == 0 and nf["new"] == 50 and nf["significant"]
    moved = metric(r, "grad_norm_layers_moved")
    assert moved["new"] >= 1 and any(k.endswith("0.weight")
                                     for k in moved["evidence"]["orders_of_magnitude"])
    assert r["verdict"] in ("regressed", "mixed")


def test_loss_is_compared_up_to_the_first_nan(tmp_path: Path) -> None:
    """Before and after a change that made training blow up at step 150: the loss until then
    is still compared (it was already worse), and says where it stops."""
    s = np.arange(200)
    a = make_run(tmp_path, name="a", steps=200, seed=1, loss=3.0 - s / 100)
    worse = np.where(s < 150, 3.2 - s / 200, np.nan)
    b = make_run(tmp_path, name="b", steps=200, seed=2, loss=worse,
                 nonfinite_grads=lambda st: (st >= 150).astype(int))
    m = metric(compare_runs(a, b), "loss_final")
    assert m["new"] > m["base"] and m["significant"]
    assert m["evidence"]["up_to_step"] == 149


def test_a_finding_whose_subject_moved_is_not_both_new_and_resolved(tmp_path: Path) -> None:
    from tracealyze.analyzer.compare.runs import findings_diff
    from tracealyze.analyzer.diagnosis.findings import Finding

    def f(fid: str, severity: str, subject: str) -> Finding:
        return Finding(id=fid, severity=severity, title=fid, message="m", subject=subject)

    base = [f("gradient_explosion", "error", "emb.weight")]
    new = [f("gradient_explosion", "warning", "rnn.weight_hh_l0"),
           f("loss_spike", "warning", "loss")]
    d = findings_diff(base, new)
    assert [f["id"] for f in d["new"]] == ["loss_spike"]
    assert d["resolved"] == [] and d["worse"] == []
    assert findings_diff(new, base)["worse"][0]["id"] == "gradient_explosion"


def test_different_models_warn_and_compare_only_what_is_comparable(tmp_path: Path) -> None:
    a = make_run(tmp_path, name="a", steps=120, seed=1, tensors=4)
    b = make_run(tmp_path, name="b", steps=80, ranks=2, seed=2, tensors=7)
    for p, n in ((a, 1000), (b, 5000)):
        meta = json.loads((p / "run.json").read_text())
        meta["model"] = {"class": "Net", "parameters": n}
        (p / "run.json").write_text(json.dumps(meta))
    r = compare_runs(a, b)
    assert not r["comparable"]
    assert any("different model" in w for w in r["warnings"])
    assert not any(m["name"].startswith(("loss_", "grad_norm")) for m in r["metrics"])
    assert any(m["name"] == "step_time_median_s" for m in r["metrics"])
    res = run_cli("compare", a, b)
    assert res.exit_code == 0 and "different model" in res.output
    # the same model at another batch size (run.json data.batch_size, from the loader)
    c = make_run(tmp_path, name="c", steps=120, seed=3, tensors=4,
                 run_meta={"data": {"batch_size": 32}})
    d = make_run(tmp_path, name="d", steps=120, seed=4, tensors=4,
                 run_meta={"data": {"batch_size": 64}})
    r = compare_runs(c, d)
    assert r["comparable"] and any("different batch size: 32 vs 64" in w
                                   for w in r["warnings"])


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    a = make_run(tmp_path, name="a", steps=50)
    line = bad(run_cli("compare", a, tmp_path / "missing"))
    assert "missing" in line
    assert "threshold" in bad(run_cli("compare", a, a, "--threshold", "-3"))


def test_mann_whitney_matches_the_textbook_values() -> None:
    # fully separated samples of 5 with ties: U = 0, p = 0.01116 (normal approx., tie- and
    # continuity-corrected; scipy.stats.mannwhitneyu(method="asymptotic") gives the same)
    assert mann_whitney_p(np.r_[1, 1, 2, 2, 3.0], np.r_[4, 4, 5, 5, 6.0]) == \
        pytest.approx(0.011159, abs=1e-6)
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, 500)
    assert mann_whitney_p(x, x.copy()) == 1.0
    # a shift of 0.1 σ over 5000 samples is "significant" to the test alone, not in effect
    big = rng.normal(0, 1, 5000)
    sig, ev = shifted(big, big + 0.1)
    assert ev["p_value"] < 0.01 and not sig
    sig, ev = shifted(big, big + 1.0)
    assert sig and ev["effect"] > 0.5
