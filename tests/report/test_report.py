"""tracealyze report: content, safety and robustness of the HTML file (no browser here;
tests/report/test_browser.py opens the files in Chromium)."""

from __future__ import annotations

import html as htmllib
import io
import json
import re
from pathlib import Path
from typing import Any

import markupsafe
import pytest
from click.testing import CliRunner
from tracealyze.analyzer.diagnosis.findings import SEVERITIES
from tracealyze.analyzer.errors import ReportError, RunDirError
from tracealyze.analyzer.report.page import MAX_DATA_BYTES, Progress, script_json, write_report

from tests.report.conftest import HOSTILE, NAN_FROM, SLOW_STEPS, SPIKE_STEP
from tests.runfactory import listing, make_run

DATA_RE = re.compile(r'<script type="application/json" id="tz-data">(.*?)</script>', re.S)


def page(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def data_of(text: str) -> dict[str, Any]:
    m = DATA_RE.search(text)
    assert m, "embedded data missing"
    return json.loads(m.group(1))


def chart(text: str, anchor: str) -> dict[str, Any]:
    charts = {c["anchor"]: c for c in data_of(text)["charts"]}
    assert anchor in charts, f"no chart {anchor!r}; have {sorted(charts)}"
    return charts[anchor]


def trace(c: dict[str, Any], name: str) -> dict[str, Any]:
    found = [t for t in c["figure"]["data"] if t.get("name", "").startswith(name)]
    assert found, f"no trace {name!r} in {[t.get('name') for t in c['figure']['data']]}"
    return found[0]


# ------------------------------------------------------------------ findings and header


def test_healthy_run_says_so_plainly(reports: dict[str, Path]) -> None:
    text = page(reports["healthy"])
    assert "Healthy run: no problems found" in text
    assert not re.search(r'class="finding sev-(warning|error|critical)"', text)


def test_findings_come_first_ranked_with_advice_and_chart_links(
        runs: dict[str, Path], reports: dict[str, Path]) -> None:
    from tracealyze.analyzer.diagnosis.summary import build_summary

    text = page(reports["sick"])
    assert "Healthy run" not in text
    sevs = re.findall(r'<article class="finding sev-(\w+)', text)
    assert sevs and text.index('<article class="finding') < text.index('class="card')
    findings = build_summary(runs["sick"])["findings"]
    assert len(sevs) == len(findings)
    # the summary's order (root causes first, each followed by what it explains), problems
    # before the informational notes
    want = ([f["severity"] for f in findings if f["severity"] != "info"]
            + [f["severity"] for f in findings if f["severity"] == "info"])
    assert sevs == want
    roots = [SEVERITIES.index(f["severity"]) for f in findings if not f["caused_by"]]
    assert roots[0] == max(SEVERITIES.index(f["severity"]) for f in findings)
    articles = re.findall(r'<article class="finding.*?</article>', text, re.S)
    anchors = {c["anchor"] for c in data_of(text)["charts"]}
    linked = 0
    for art in articles:
        if "sev-info" not in art:
            assert "What to try:" in art
        link = re.search(r'class="chart-link" href="#([\w-]+)"', art)
        if link:
            linked += 1
            assert link.group(1) in anchors and f'id="{link.group(1)}"' in text
    assert linked == sum(1 for f in findings if f["chart"] in anchors) >= 5
    ids = set(re.findall(r'<span class="mono">(\w+)</span>', text))
    assert {"memory_leak", "loss_spike", "nonfinite", "training_crashed"} <= ids


def test_header_has_status_steps_ranks_model_versions_host(reports: dict[str, Path]) -> None:
    text = page(reports["sick"])
    facts = dict(re.findall(r"<dt>(.*?)</dt><dd[^>]*>(.*?)</dd>", text.split("</header>")[0]))
    assert re.search(r'id="run-status">crashed<', text)
    assert facts["Steps"].startswith("1,500")
    assert facts["Ranks"] == "2"
    assert facts["Preset"] == "standard"
    assert "124.0 M parameters" in facts["Model"]
    assert "torch 2.13.0" in facts["Versions"]
    assert facts["Host"] == "gpu-node-07"
    assert facts["Wall time"] not in ("", "—")


@pytest.mark.parametrize(("name", "status"), [("healthy", "completed"),
                                              ("running", "still running"),
                                              ("killed", "stopped")])
def test_status_completed_running_or_killed(reports: dict[str, Path], name: str,
                                            status: str) -> None:
    assert re.search(rf'id="run-status">{status}<', page(reports[name]))


# ------------------------------------------------------------------ charts


def test_every_chart_has_axis_titles_and_the_sections_it_needs(reports: dict[str, Path]) -> None:
    sick = data_of(page(reports["sick"]))
    anchors = {c["anchor"] for c in sick["charts"]}
    assert {"loss", "lr", "grad-norm", "grad-heatmap", "memory", "step-time", "events",
            "ranks", "profiler", "gpu-time"} <= anchors
    for c in sick["charts"]:
        lay = c["figure"]["layout"]
        assert lay["xaxis"]["title"]["text"], c["anchor"]
        if c["anchor"] != "grad-heatmap":  # rows are labelled by tensor name instead
            assert lay["yaxis"]["title"]["text"], c["anchor"]
        assert any(t.get("hovertemplate") or t.get("hoverinfo") for t in c["figure"]["data"])
    healthy = {c["anchor"] for c in data_of(page(reports["healthy"]))["charts"]}
    assert "ranks" not in healthy and "profiler" not in healthy  # one rank, no traces
    assert {"loss", "grad-heatmap", "memory", "step-time", "metrics"} <= healthy


def test_loss_spike_survives_downsampling_and_nonfinite_steps_are_marked(
        reports: dict[str, Path]) -> None:
    text = page(reports["sick"])
    loss = chart(text, "loss")
    line = trace(loss, "loss")
    assert 8.0 in line["y"] and SPIKE_STEP in line["x"]
    assert all(x < NAN_FROM for x in line["x"])  # inf losses are not drawn as values...
    bands = [s for s in loss["figure"]["layout"]["shapes"] if s["type"] == "rect"]
    assert bands and min(s["x0"] for s in bands) == NAN_FROM - 0.5  # ...but banded
    grad = chart(text, "grad-norm")
    assert any(s["type"] == "rect" and s["x0"] == NAN_FROM - 0.5
               for s in grad["figure"]["layout"]["shapes"])


def test_heatmap_is_log_scaled_in_model_order_with_nonfinite_cells(
        reports: dict[str, Path]) -> None:
    hm = chart(page(reports["sick"]), "grad-heatmap")
    heat = next(t for t in hm["figure"]["data"] if t["type"] == "heatmap")
    names = hm["extra"]["names"]
    assert names.index("layers.2.weight") < names.index("layers.10.weight") if \
        "layers.10.weight" in names else names.index("layers.1.bias") < names.index(
            "layers.2.weight")
    assert len(heat["z"]) == len(names) and len(heat["x"]) <= 200
    # log10 of the norms: the synthetic norms are ~0.05..0.25 before the explosion
    assert -2 < heat["z"][1][0] < 0
    bad = trace(hm, "NaN/Inf")
    rows = {names[i] for i in bad["y"]}
    assert rows == {"layers.3.weight", "layers.3.bias"}
    assert min(bad["x"]) >= NAN_FROM - 10


def test_memory_chart_draws_leak_fit_and_projected_oom(reports: dict[str, Path]) -> None:
    text = page(reports["sick"])
    mem = chart(text, "memory")
    names = [t["name"] for t in mem["figure"]["data"]]
    assert {"RSS (host)", "CUDA allocated", "CUDA reserved"} <= set(names)
    fit = trace(mem, "leak fit (CUDA allocated)")
    proj = trace(mem, "projected (CUDA allocated)")
    # fit slope in the chart's unit (GiB) matches the injected 4 MB/step within 10%
    slope = (fit["y"][1] - fit["y"][0]) / (fit["x"][1] - fit["x"][0]) * 2**30
    assert slope == pytest.approx(4e6, rel=0.1)
    # the projection ends where the 24 GB GPU would be full: (24e9 - 8e9) / 4e6 = step 4000
    assert proj["x"][-1] == pytest.approx(4000, rel=0.05)
    assert "projected out of memory at step" in text


def test_step_time_marks_outliers_and_splits_data_wait(reports: dict[str, Path]) -> None:
    st = chart(page(reports["sick"]), "step-time")
    assert set(trace(st, "outlier")["x"]) == set(SLOW_STEPS)
    assert trace(st, "data wait")["stackgroup"] == trace(st, "compute")["stackgroup"]
    assert max(trace(st, "slowest")["y"]) == pytest.approx(800, rel=0.01)  # ms


def test_ranks_and_profiler_sections(reports: dict[str, Path]) -> None:
    text = page(reports["sick"])
    bars = chart(text, "ranks")
    assert trace(bars, "data wait")["x"] == ["rank 0", "rank 1"]
    prof = chart(text, "profiler")
    assert prof["figure"]["data"][0]["orientation"] == "h"
    assert any("aten::" in y for y in prof["figure"]["data"][0]["y"])
    gpu = chart(text, "gpu-time")
    assert {t["name"] for t in gpu["figure"]["data"]} >= {"compute", "idle"}


def test_events_grouped_with_collapsible_stack_traces(reports: dict[str, Path]) -> None:
    text = page(reports["sick"])
    assert "<details><summary>stack trace</summary>" in text
    assert re.search(r'class="kind">recorder_error</span>.*?×22', text, re.S)
    assert 'id="events"' in text and "before the first step" in text


# ------------------------------------------------------------------ untrusted text


def test_hostile_names_and_messages_cannot_inject_markup(reports: dict[str, Path]) -> None:
    text = page(reports["sick"])
    # exactly our three script elements: JSON data, plotly, the page script
    assert len(re.findall(r"<script", text, re.I)) == 3
    assert len(re.findall(r"</script", text, re.I)) == 3
    assert "<!--" not in text
    assert "<img" not in text.lower()
    assert str(markupsafe.escape(HOSTILE)) in text  # shown as text in the event list
    # in the embedded data, plotly labels carry the HTML-escaped name (plotly renders tags)
    names = chart(text, "grad-heatmap")["extra"]["names"]
    assert htmllib.escape(HOSTILE + ".weight", quote=False) in names


def test_script_json_cannot_close_the_script() -> None:
    value = {"a": "</ScRiPt><!--x-->&\u2028\u2029", "b": [1.5, None, "</script >"]}
    out = script_json(value)
    assert not set(out) & {"<", ">", "&", "\u2028", "\u2029"}
    assert json.loads(out) == value
    with pytest.raises(ValueError):
        script_json({"nan": float("nan")})  # not JSON: chart builders must drop these


# ------------------------------------------------------------------ scale and files


def test_embedded_data_is_bounded_however_long_the_run(tmp_path: Path) -> None:
    sizes = {}
    for steps in (2_000, 60_000):
        rd = make_run(tmp_path, name=f"long{steps}", steps=steps, tensors=4,
                      tensor_kinds=("grad",), loss=lambda s: 1.0 + (s == 31_337) * 50.0)
        out = write_report(rd, tmp_path / f"{steps}.html", progress=False)
        text = page(out)
        sizes[steps] = len(DATA_RE.search(text).group(1))
        loss = trace(chart(text, "loss"), "loss")
        assert len(loss["x"]) <= 2 * 1000
        if steps > 31_337:
            assert 51.0 in loss["y"] and 31_337 in loss["x"]  # one-step spike survives 30:1
        assert out.stat().st_size <= 8 * 2**20
    assert sizes[60_000] <= MAX_DATA_BYTES
    assert sizes[60_000] < 2.5 * sizes[2_000]  # bounded, not proportional to 30x the steps


def test_default_output_is_in_the_working_directory_and_the_run_is_untouched(
        runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DESIGN.md turn 4: `report RUN` writes ./<run-name>.html; the analyzer never writes
    into a run directory unasked (a stranger's run may hold links at any name it would)."""
    rd = make_run(tmp_path, name="r", steps=30)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    before = listing(rd)
    out = write_report(rd, progress=False)
    assert out == Path("r.html") and (here / "r.html").stat().st_size > 10_000
    assert listing(rd) == before
    assert sorted(p.name for p in here.iterdir()) == ["r.html"]  # no temporary left
    # asked for explicitly, the run is where it goes
    assert write_report(rd, rd / "report.html", progress=False) == rd / "report.html"
    assert set(listing(rd)) - set(before) == {"report.html"}


def test_bad_inputs_raise_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(RunDirError):
        write_report(tmp_path / "missing", progress=False)
    (tmp_path / "notarun").mkdir()
    with pytest.raises(RunDirError):
        write_report(tmp_path / "notarun", progress=False)
    rd = make_run(tmp_path, name="r", steps=10)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ReportError, match="cannot"):
        write_report(rd, tmp_path / "afile" / "r.html", progress=False)
    # a missing folder of the output the user named is made
    assert write_report(rd, tmp_path / "new" / "r.html", progress=False).is_file()


def test_cli_report_prints_the_path(runs: dict[str, Path], tmp_path: Path) -> None:
    from tracealyze.analyzer.cli import main

    out = tmp_path / "cli.html"
    res = CliRunner().invoke(main, ["report", str(runs["healthy"]), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert res.output.strip().endswith(str(out)) and out.stat().st_size > 1_000_000


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal_and_after_the_delay() -> None:
    quiet, loud = _Terminal(), _Terminal()
    p = Progress(total=3, enabled=True, stream=quiet, delay_s=3600.0)
    p.step("a")
    p.finish()
    assert quiet.getvalue() == ""
    p = Progress(total=3, enabled=True, stream=loud, delay_s=0.0)
    p.step("charts")
    p.finish()
    assert "1/3" in loud.getvalue() and "charts" in loud.getvalue()
    for off in (_Terminal(), io.StringIO()):  # turned off, or piped: nothing at all
        p = Progress(total=3, enabled=off.isatty() is False, stream=off, delay_s=0.0)
        p.step("a")
        p.finish()
        assert off.getvalue() == ""
    # a long first stage still shows the bar once the delay has passed (timer thread)
    mid = _Terminal()
    p = Progress(total=3, enabled=True, stream=mid, delay_s=0.01)
    p._timer.join()
    assert "0/3" in mid.getvalue()
    p.finish()


def test_report_works_offline(reports: dict[str, Path]) -> None:
    text = page(reports["sick"])
    # nothing is fetched: no external src/href, and a CSP that forbids any connection
    markup = re.sub(r"<script[^>]*>.*?</script>", "", text, flags=re.S)  # plotly's own strings
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', markup)
    assert "default-src 'none'" in text
    assert text.count("sha256-") == 2


def test_heatmap_stays_bounded_for_big_models(tmp_path: Path) -> None:
    rd = make_run(tmp_path, name="big", steps=40, tensors=600, tensor_kinds=("grad",))
    hm = chart(page(write_report(rd, tmp_path / "big.html", progress=False)), "grad-heatmap")
    names = hm["extra"]["names"]
    assert len(names) <= 256 and len(hm["figure"]["data"][0]["z"]) == len(names)
    assert names[0].startswith("layers.0.weight … ") and "(3 tensors)" in names[0]


def test_report_says_what_could_not_be_checked(tmp_path: Path) -> None:
    from tracealyze.analyzer.report.page import write_report

    from tests.runfactory import make_run

    run = make_run(tmp_path, steps=100, loss=None, grad_norm=None)
    text = write_report(run, tmp_path / "r.html").read_text()
    assert "No problems found in what could be checked" in text
    assert "Healthy run: no problems found" not in text
    assert 'id="not-checked"' in text and "no loss was recorded" in text


def test_step_time_caption_counts_the_findings_outliers(tmp_path: Path) -> None:
    """The chart and the finding use one rule: their counts agree (they used to say 27 and
    17 of the same run: warm-up and the recorder's own statistics steps counted in one)."""
    import numpy as np
    from tracealyze.analyzer.diagnosis.summary import build_summary
    from tracealyze.analyzer.report.page import write_report

    from tests.runfactory import make_run

    rng = np.random.default_rng(0)
    dur = 0.1 * np.exp(rng.normal(0, 0.05, 400))
    dur[:3] = 2.0  # warm-up: slow, but not counted by either
    dur[[50, 120, 121, 300]] = 1.5
    run = make_run(tmp_path, steps=400, duration=dur)
    (f,) = [f for f in build_summary(run)["findings"] if f["id"] == "step_time_outlier"]
    text = write_report(run, tmp_path / "r.html").read_text()
    m = re.search(r"(\d+) slow steps? above", text)
    assert m and int(m.group(1)) == f["evidence"]["count"] == 4


def test_loss_axis_scale_follows_the_data(tmp_path: Path) -> None:
    """An exploding loss opens on a log axis (on a linear one it is a flat line, then a
    wall); an ordinary one stays linear."""
    import numpy as np
    from tracealyze.analyzer.report.page import write_report

    from tests.runfactory import make_run

    s = np.arange(300)
    runs = {"exploding": make_run(tmp_path, name="x", steps=300,
                                  loss=np.where(s < 150, 2.0, 2.0 * 1.08 ** (s - 150.0))),
            "ordinary": make_run(tmp_path, name="o", steps=300, loss=2.0 - s / 300)}
    types = {}
    for name, run in runs.items():
        text = write_report(run, tmp_path / f"{name}.html").read_text()
        (loss,) = [c for c in data_of(text)["charts"] if c["anchor"] == "loss"]
        types[name] = loss["figure"]["layout"]["yaxis"].get("type", "linear")
    assert types == {"exploding": "log", "ordinary": "linear"}
