"""``tracealyze report``: one self-contained, offline, interactive HTML file per run.

Pipeline: open the run (catalog) → findings (summary) → downsampled chart data (DuckDB, see
``downsample``) → JSON embedded in a jinja2 page with plotly.js inlined. The page needs no
network. Everything user code controls (names, messages, stack traces) is escaped: by jinja2
autoescaping in HTML, by :func:`script_json` inside ``<script>``, and by ``figures.esc`` in
text that plotly renders.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from ..diagnosis.findings import SEVERITIES, Finding
from ..errors import ReportError, TracealyzeError
from .cards import cards, for_display
from .context import ReportContext
from .figures import Chart
from .header import run_header
from .progress import Progress

PLOTLY_FILE = "plotly-cartesian.min.js"
PLOTLY_VERSION_FILE = "plotly-cartesian.VERSION.txt"
MAX_DATA_BYTES = 2 * 1024 * 1024
"""Budget of the embedded chart data (issue 4); charts are bounded well below it."""

_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                   "\u2028": "\\u2028", "\u2029": "\\u2029"}


def script_json(data: Any) -> str:
    """JSON that is safe inside ``<script>``: no ``</script>`` (any case), ``<!--`` or line
    separators can appear, because ``<``, ``>``, ``&``, U+2028 and U+2029 are \\u-escaped
    (the JSON value is unchanged). NaN/Inf are refused: they are not JSON."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    for ch, rep in _SCRIPT_ESCAPES.items():
        text = text.replace(ch, rep)
    return text


def _open_run(run_dir: Path | str) -> Any:
    from ..run.catalog import open_run

    return open_run(run_dir)


def _analyse(run: Any, overrides: Any) -> tuple[list[Finding], Any, list[dict[str, Any]]]:
    """(findings, GPU time rows, not checked) of the run's one Analysis, in the summary's
    order: root causes first, each followed by what it explains; late failures last."""
    from ..diagnosis.analysis import Analysis
    from ..diagnosis.summary import all_findings

    analysis = Analysis(run, overrides)
    return all_findings(analysis), analysis.gpu_time, analysis.not_checked


def _training(ctx: ReportContext) -> list[tuple[str, str, list[Chart]]]:
    from .charts.tensors import tensor_charts
    from .charts.training import training_charts

    return [("training", "Training", training_charts(ctx) + tensor_charts(ctx))]


def _distributions(ctx: ReportContext) -> list[tuple[str, str, list[Chart]]]:
    from .charts.histograms import histogram_charts

    return [("histograms-section", "Distributions", histogram_charts(ctx))]


def _performance(ctx: ReportContext) -> list[tuple[str, str, list[Chart]]]:
    from .charts.perf import perf_charts

    perf = perf_charts(ctx)
    per_rank = [c for c in perf if c.anchor.startswith("ranks")]
    return [("performance", "Performance", [c for c in perf if c not in per_rank]),
            ("ranks-section", f"Ranks ({len(ctx.ranks)})", per_rank)]


def _profiler(ctx: ReportContext) -> list[tuple[str, str, list[Chart]]]:
    from .charts.profiler import profiler_charts

    return [("profiler-section", "Profiler", profiler_charts(ctx))]


SECTIONS: tuple[tuple[str, Callable[[ReportContext], list[tuple[str, str, list[Chart]]]]],
                ...] = (
    ("training charts", _training),
    ("distributions", _distributions),
    ("performance charts", _performance),
    ("profiler", _profiler),
)
"""The report's sections, in page order: (progress label, builder of (anchor, title,
charts) sections). The events table and chart follow them. A new section is one entry."""

STEPS: int = 3 + len(SECTIONS) + 1
"""Progress steps of one report: open, findings, each section, events, render."""


def collect(run: Any, findings: list[Finding],
            tick: Callable[[str], None] = lambda _label: None,
            gpu_time: list[dict[str, Any]] | None = None,
            not_checked: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Everything the template needs, from an open run, its findings (typed, from its
    Analysis), the GPU time breakdown (computed once, by the analysis) and what could not be
    checked."""
    from .events import event_rows, events_chart
    from .model import model_section
    from .oom import oom_section

    ranks = sorted(int(r) for r in (run.ranks or [0]))
    ctx = ReportContext(con=run.con, ranks=ranks, rank=ranks[0] if ranks else 0,
                        knobs=dict((getattr(run, "meta", None) or {}).get("knobs") or {}),
                        findings=for_display(findings),
                        gpu_time=[r for r in (gpu_time or []) if r.get("total_us")])
    sections: list[tuple[str, str, list[Chart]]] = []
    for label, build in SECTIONS:
        sections.extend(s for s in build(ctx) if s[2])
        tick(label)
    model = model_section(ctx)
    ev_chart = events_chart(ctx)
    ev_rows, ev_groups, ev_total = event_rows(ctx)
    tick("events")
    charts = [c for _, _, cs in sections for c in cs]
    if ev_chart:
        charts.append(ev_chart)
    return {
        "header": run_header(run, ctx),
        "findings": cards(ctx.findings, {c.anchor for c in charts}),
        "not_checked": not_checked or [],
        "sections": sections,
        "model": model,
        "oom": oom_section(findings),
        "events_chart": ev_chart,
        "events": ev_rows, "event_groups": ev_groups, "event_total": ev_total,
        "gpu_time": ctx.gpu_time,
        "charts": charts,
        "multi_rank": len(ranks) > 1,
        "rank": ctx.rank,
    }


def _read_asset(name: str) -> str:
    try:
        return resources.files("tracealyze.templates").joinpath(name).read_text("utf-8")
    except (FileNotFoundError, ModuleNotFoundError, OSError) as exc:
        raise ReportError(f"report asset {name} is missing from the installation: {exc}") \
            from exc


def _environment() -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("tracealyze.templates", "."),
        autoescape=True,  # everything, whatever the template's extension
        undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True,
    )


def render(model: dict[str, Any], template_name: str = "report.html.j2",
           page_js: str | None = None) -> str:
    """The page ``template_name`` for ``model`` (from :func:`collect`, or the compare or
    fleet page's): the charts' JSON, plotly.js, the CSS and the page script inlined;
    ``page_js`` names one more script asset of that page (its own hash in the CSP)."""
    from markupsafe import Markup

    data = script_json({"charts": [c.to_json() for c in model["charts"]]})
    if len(data.encode("utf-8")) > MAX_DATA_BYTES:
        # Bounded by construction; this guards against a chart builder losing its bound.
        raise ReportError(f"report data is {len(data) / 2**20:.1f} MiB, over the "
                          f"{MAX_DATA_BYTES // 2**20} MiB budget (a bug: please report it)")
    plotly_js = _read_asset(PLOTLY_FILE)
    # Inlined as-is: it must not be able to end its own <script> element.
    if "</script" in plotly_js.lower() or "<!--" in plotly_js:
        raise ReportError(f"{PLOTLY_FILE} cannot be inlined safely")
    version = _read_asset(PLOTLY_VERSION_FILE).split("\n", 1)[0].strip()
    app_js = _read_asset("report.js")
    extra_js = _read_asset(page_js) if page_js else ""
    template = _environment().get_template(template_name)
    return template.render(
        **model,
        severities=SEVERITIES,
        data_json=Markup(data),
        plotly_js=Markup(plotly_js),
        plotly_version=version,
        css=Markup(_read_asset("report.css")),
        app_js=Markup(app_js),
        page_js=Markup(extra_js),
        # Only these inline scripts may run: an injected handler could not, even if some
        # text escaped escaping (defence in depth).
        script_hashes=Markup(" ".join(_csp_hash(js) for js in (plotly_js, app_js, extra_js)
                                      if js)),
        generated=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    )


def _csp_hash(script: str) -> str:
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


def default_output(run_dir: Path | str) -> Path:
    """Where ``report RUN`` writes without ``-o``: ``./<run-name>.html`` in the current
    directory (DESIGN.md, turn 4: the analyzer never writes into a run directory unasked;
    a run is often a stranger's, or read-only, or in a store). The name keeps letters,
    digits, ``-``, ``_`` and ``.`` of the run folder's last segment (no leading dot)."""
    from tracealyze.format.storage import is_url

    text = str(run_dir)
    last = text.rstrip("/").rsplit("/", 1)[-1] if is_url(text) else Path(text).resolve().name
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in last)[:100].lstrip(".")
    return Path(f"{name or 'report'}.html")


def write_report(run_dir: Path | str, out: Path | str | None = None, *, overrides: Any = None,
                 progress: bool = True, live_refresh_s: float | None = None) -> Path | str:
    """Write the HTML report of ``run_dir`` to ``out`` (default :func:`default_output`:
    ``./<run-name>.html``) and return where it went. Raises RunDirError for a bad run
    directory, ReportError otherwise; a progress bar goes to stderr when it takes more than
    a second (``progress``).

    ``run_dir`` may be a URL (``s3://...``): the report is built from the run's local
    mirror. ``out`` may be a URL too (``-o s3://bucket/run/report.html``): the page is
    uploaded there in one write (a store that refuses is a ReportError). The file is
    written through :mod:`..writes` (a new temporary file, renamed; never through a link).
    ``live_refresh_s``: the page says it is live (the time of this update) and reloads
    itself that often (``report --watch``)."""
    from tracealyze.format.storage import is_url

    url = str(run_dir) if is_url(str(run_dir)) else None
    dest = out if out is not None else default_output(run_dir)
    bar = Progress(total=STEPS, enabled=progress)
    try:
        html = _build_report(url or Path(run_dir), overrides, bar, live_refresh_s)
    finally:
        bar.finish()
    if is_url(str(dest)):
        return _upload_report(str(dest), html)
    write_atomic(Path(dest), html)
    return Path(dest)


def _upload_report(dest: str, html: str) -> str:
    """The report written as the object ``dest`` (the user asked for it there)."""
    from tracealyze.format.storage import locate, write_bytes

    from ..errors import one_line

    folder, _, name = dest.rstrip("/").rpartition("/")
    try:
        write_bytes(locate(folder), name, html.encode("utf-8"))
    except (OSError, ValueError) as e:
        raise ReportError(f"cannot write the report to {dest} ({one_line(e)[:200]}); give "
                          "-o PATH to write it elsewhere") from None
    return dest


def _build_report(run_dir: Path | str, overrides: Any, bar: Progress,
                  live_refresh_s: float | None = None) -> str:
    run = _open_run(run_dir)  # (a URL: its local mirror)
    try:
        bar.step("opened run")
        findings, gpu, not_checked = _analyse(run, overrides)
        bar.step("findings")
        model = collect(run, findings, bar.step, gpu, not_checked)
    except TracealyzeError:  # RunDirError, ConfigError (bad overrides), ...: already clear
        raise
    except Exception as exc:
        raise ReportError(f"could not build the report of {run_dir}: "
                          f"{type(exc).__name__}: {exc}") from exc
    finally:
        run.close()
    if live_refresh_s:
        model["live"] = {"refresh_s": max(1, round(live_refresh_s)),
                         "updated": time.strftime("%H:%M:%S")}
    html = render(model)
    bar.step("rendered")
    return html


def write_atomic(out: Path, text: str) -> None:
    """Write ``text`` to ``out`` through :func:`..writes.write_file`: a new temporary file
    (random name, ``O_EXCL|O_NOFOLLOW``) renamed onto ``out``, refused if ``out`` is a link
    or a folder; no half-written page is ever left."""
    from ..writes import OutputError, write_file

    if Path(out).is_dir() and not Path(out).is_symlink():
        raise ReportError(f"-o {out} is a directory; give a file name (e.g. report.html)")
    try:
        write_file(out, text)
    except OutputError as exc:
        raise ReportError(str(exc).replace("cannot write ", "cannot write the report to ", 1)
                          ) from None
