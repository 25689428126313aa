"""``tracealyze fleet``: the command (a thin layer over :mod:`.fleet`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .edge import EXIT_FAIL_ON, edge
from .output import dict_rows, format_options, write_rows

FLEET_CSV = ("run_id", "path", "status", "started", "duration_s", "steps", "world_size",
             "model_class", "throughput_steps_per_s", "peak_rss_bytes",
             "peak_cuda_allocated_bytes", "top_finding", "top_severity", "top_subject",
             "top_first_step", "n_warning", "n_error", "n_critical", "error", "hparams")
"""fleet --format csv: one row per run of the index (hparams as a JSON object's text)."""


@click.command()
@click.argument("roots", nargs=-1, required=True)
@format_options("run")
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=None,
              help="Write the fleet page (HTML) there.")
@click.option("--fail-on", type=click.Choice(["warning", "error", "critical"]), default=None,
              help="Exit 1 if a run's worst finding, or a fleet finding, is at least this "
                   "severe (an unreadable run counts as error).")
@click.option("--engine", type=click.Choice(["local", "spark"]), default="local",
              show_default=True, help="Where the per-run analyses run.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Local: processes (default: one per core). Spark: tasks (default: 4 per "
                   "executor core).")
@click.option("--index", "index", type=click.Path(path_type=Path), default=None,
              help="Where the index is kept (default ROOT/_tracealyze/fleet; for a URL or "
                   "several roots, the local cache).")
@click.option("--reports", is_flag=True,
              help="Write each run's report next to the page (needs -o) and link each row "
                   "to it; only reports that are missing or out of date are written.")
@click.option("--spark-master", default=None, metavar="URL",
              help="Spark master when no SparkSession is active (default local[*]).")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines on stderr.")
@edge
def fleet(roots: tuple[str, ...], fmt: str, out: Path | None, fail_on: str | None,
          engine: str, jobs: int | None, index: Path | None, reports: bool,
          spark_master: str | None, quiet: bool) -> None:
    """Analyse every run under ROOT... (directories, globs, s3:// or gs:// prefixes) and
    keep one row per run in an incremental index: only new or changed runs are analysed.
    What cannot be searched or read (a folder not listable, a name that is not UTF-8, more
    than 64 folders deep) is one warning line on stderr, and the rest goes on.

    Prints the runs with something to look at, worst first, and the findings only the
    fleet shows (suspect_host: a host that is the slow rank in the runs it joins).
    `tracealyze query --fleet ROOT "SQL"` then queries the index and the runs.

    \b
    Example:
      tracealyze fleet /shared/runs -o fleet.html --reports
      tracealyze fleet s3://team-bucket/runs --json --fail-on error
      tracealyze fleet /shared/runs --engine spark --spark-master spark://head:7077
    """
    from ..errors import ConfigError
    from ..fleet.fleet import fails, run_fleet

    if reports and out is None:
        raise ConfigError("--reports writes the reports next to the page: give -o fleet.html")
    from ..report.progress import counter

    show, done = counter("fleet: analysed", not quiet)
    try:
        result = run_fleet(list(roots), engine=engine, jobs=jobs, index=index,
                           spark_master=spark_master, progress=show)
    finally:
        done()
    if out is not None:
        from ..fleet.page import write_page, write_reports

        links = {}
        if reports:
            folder = out.parent / f"{out.stem}-reports"
            show, done = counter("fleet: reports", not quiet)
            try:
                links = write_reports(result, folder, show)
            finally:
                done()
            prefix = f"{folder.name}/"
        write_page(result, out, links, prefix if reports else "")
    # what was not analysed, one line each (a stranger's entry never stops the others);
    # said once every write succeeded: a command that fails says only why (one line)
    for s in result.skipped:
        click.echo(f"warning: skipped {s.name}: {s.reason}", err=True)
    if result.skipped:
        n = len(result.skipped)
        click.echo(f"warning: {n} entr{'y' if n == 1 else 'ies'} under the roots skipped",
                   err=True)
    for line in result.warnings:
        click.echo(f"warning: {line}", err=True)
    if out is not None:
        click.echo(f"wrote {out}", err=True)
    if fmt == "json":
        click.echo(json.dumps(result.to_json(), indent=1))
    elif fmt == "csv":
        runs = [{**r, "hparams": json.dumps(r["hparams"], sort_keys=True)
                 if r.get("hparams") else None} for r in result.to_json()["runs"]]
        write_rows(*dict_rows(runs, FLEET_CSV), fmt)
    else:
        from ..fleet.render import render_text

        click.echo(render_text(result))
    if fail_on and fails(result, fail_on):
        sys.exit(EXIT_FAIL_ON)
