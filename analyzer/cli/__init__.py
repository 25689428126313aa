"""The ``tracealyze`` command line.

Start-up must stay fast (``--help`` in well under 0.3 s) and never import torch: this module
imports only click and the standard library at the top; duckdb, pyarrow and the analysis code
are imported inside the commands. Library errors (``errors.TracealyzeError``) become one line
on stderr and exit code 2 here, at the edge, and nowhere else.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from .edge import EXIT_FAIL_ON, FAIL_ON, RUN_DIR, BadInput, edge
from .fleet import fleet
from .output import dict_rows, format_options, write_rows
from .recording import record, upload

SUMMARY_CSV = ("severity", "id", "subject", "first_step", "title", "message", "advice")
"""summary --format csv: one row per finding, in rank order."""
COMPARE_CSV = ("name", "base", "new", "change_pct", "significant", "better", "test")
"""compare --format csv: one row per compared metric."""


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="tracealyze")
def main() -> None:
    """Analyze tracealyze training runs: findings, SQL, HTML report.

    \b
    Example:
      tracealyze summary runs/exp1
      tracealyze query runs/exp1 "SELECT step, loss FROM steps ORDER BY step DESC LIMIT 5"
    """
    import warnings

    # A run's extreme values (a step of 1e308 s, inf norms) overflow numpy arithmetic: the
    # result (inf) is what is shown; numpy's RuntimeWarning is noise on the terminal. Set
    # once, before any reader thread starts (a per-call catch_warnings is not thread-safe).
    warnings.simplefilter("ignore", RuntimeWarning)


@main.command()
@click.argument("run_dir", type=RUN_DIR)
@format_options("column of a table")
@edge
def tables(run_dir: Path, fmt: str) -> None:
    """List the run's tables (views), their columns and row counts.

    \b
    Example:
      tracealyze tables runs/exp1
      tracealyze tables runs/exp1 --format csv
    """
    from ..run.catalog import open_run

    with open_run(run_dir) as run:
        listing = run.tables()
        skipped = list(run.skipped_parts)
    if fmt == "json":
        import json

        click.echo(json.dumps([{"table": name, "rows": count,
                                "columns": [{"name": c, "type": t} for c, t in cols]}
                               for name, cols, count in listing], indent=1))
    elif fmt == "csv":
        write_rows(["table", "column", "type", "table_rows"],
                   [[name, c, t, count] for name, cols, count in listing for c, t in cols], fmt)
    else:
        for name, cols, count in listing:
            click.echo(f"{name}  ({count:,} rows)")
            for col, typ in cols:
                click.echo(f"    {col:<22} {typ}")
    for path, why in skipped:
        click.echo(f"skipped {path}: {why}", err=True)


@main.command()
@click.argument("run_dirs", nargs=-1, type=RUN_DIR)
@click.argument("sql")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
              show_default=True, help="Output format.")
@click.option("--allow-files", is_flag=True,
              help="Let the SQL read files outside the given runs (read_csv, read_parquet, "
                   "glob, ...). Off by default: a query sees only the runs it was given.")
@click.option("--fleet", "fleet_root", default=None, metavar="ROOT",
              help="Query the fleet under ROOT (indexed by `tracealyze fleet ROOT`): views "
                   "runs, findings, fleet_ranks, and every run table across its runs.")
@click.option("--runs", "runs_where", default=None, metavar="PREDICATE",
              help="With --fleet: build the run tables over the runs this SQL predicate on "
                   "`runs` selects only (e.g. \"status = 'crashed'\").")
@click.option("--index", "index", type=click.Path(path_type=Path), default=None,
              help="With --fleet: the index, if not the default one.")
@edge
def query(run_dirs: tuple[Path, ...], sql: str, fmt: str, allow_files: bool,
          fleet_root: str | None, runs_where: str | None, index: Path | None) -> None:
    """Run one read-only SQL statement (DuckDB dialect) over the run's tables.

    Every table (steps, tensor_stats, metrics, events, memory, system, trace_events) is a view
    of that name over all ranks and parts. Given several runs, every view covers all of them
    and gains leading run_id and run_path columns (a directory in the list that is
    not a run is skipped with a warning). The SQL can read only these runs' files unless
    --allow-files is given; it can never write. With --fleet ROOT, the views are the
    fleet's: runs, findings and fleet_ranks from its index, and the run tables over its runs.

    \b
    Example:
      tracealyze query runs/exp1 "SELECT name, max(norm) FROM tensor_stats
          WHERE kind = 'grad' GROUP BY name ORDER BY 2 DESC LIMIT 10" --format csv
      tracealyze query runs/lr-* "SELECT run_id, median(duration_s), min(loss)
          FROM steps GROUP BY run_id ORDER BY 3"
      tracealyze query --fleet /shared/runs "SELECT top_finding, count(*) FROM runs
          GROUP BY 1 ORDER BY 2 DESC"
    """
    _refuse_unless_read(sql)  # (before any run is opened or any name is bound)
    if fleet_root is not None:
        if run_dirs:
            raise BadInput("give run directories or --fleet ROOT, not both")
        from ..fleet.sql import open_fleet

        opened = open_fleet(fleet_root, sql, index=index, runs_where=runs_where,
                            allow_files=allow_files)
    elif not run_dirs:
        raise BadInput("give a run directory (or several, or --fleet ROOT) and the SQL")
    elif runs_where is not None or index is not None:
        raise BadInput("--runs and --index go with --fleet ROOT")
    elif len(run_dirs) == 1 and not any(ch in str(run_dirs[0]) for ch in "*?["):
        from ..run.catalog import open_run
        from ..sql.schema import tables_named

        opened = open_run(run_dirs[0], allow_files=allow_files,  # (a URL: fetch what it reads)
                          tables=tables_named(sql) if isinstance(run_dirs[0], str) else None)
    else:  # (several runs, or a URL pattern naming runs)
        from ..run.multirun import open_runs

        opened = open_runs(run_dirs, allow_files=allow_files)
    with opened as runs:
        cols, rows = runs.query(sql)
        # (said only once the query ran: a failing query ends on its one line)
        for why in getattr(runs, "skipped", ()):
            click.echo(f"warning: skipped {why}", err=True)
    write_rows(cols, rows, fmt)


def _refuse_unless_read(sql: str) -> None:
    """QueryError (one line, exit 2) unless ``sql`` is one read statement (sql.safe's
    allow-list), checked on a bare connection before anything else happens."""
    import duckdb

    from ..sql.safe import check_user_sql

    con = duckdb.connect(":memory:")
    try:
        check_user_sql(con, sql)
    finally:
        con.close()


_SET_HELP = ("Override a threshold: DETECTOR.KEY=VALUE (repeatable), "
             "e.g. memory_leak.min_slope_bytes=1e6.")
_CONFIG_HELP = "Thresholds file (TOML: [detector] tables, or JSON)."


@main.command()
@click.argument("run_dir", type=RUN_DIR)
@format_options("finding")
@click.option("--fail-on", type=FAIL_ON, default=None,
              help="Exit 1 if a finding is at least this severe (warning, error, critical), "
              "or if a finding of this id is above info (e.g. cuda_oom): a CI gate.")
@click.option("--set", "overrides", multiple=True, metavar="DETECTOR.KEY=VALUE", help=_SET_HELP)
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None,
              help=_CONFIG_HELP)
@click.option("--watch", is_flag=True, help="Follow a live run: say each new finding as "
              "it appears; stop when the run ends, or at once when --fail-on is reached.")
@click.option("--interval", type=click.FloatRange(min=0.5), default=10.0, show_default=True,
              help="With --watch: seconds between looks.")
@edge
def summary(run_dir: Path, fmt: str, fail_on: str | None, overrides: tuple[str, ...],
            config_file: Path | None, watch: bool, interval: float) -> None:
    """Say what went wrong in a run: ranked findings with evidence and advice.

    Exit code 1 when --fail-on is given and a finding reaches that severity.

    \b
    Example:
      tracealyze summary runs/exp1
      tracealyze summary runs/exp1 --json --fail-on error --set loss_spike.z=10
      tracealyze summary runs/live --watch --fail-on error   # exit 1 at the first error
    """
    from ..diagnosis.summary import build_summary, fails, render_text

    if watch:
        from ..report.watch import watch_summary

        try:
            result, _ = watch_summary(run_dir, fail_on=fail_on, interval_s=interval,
                                      say=(lambda t: click.echo(t, err=True)) if fmt != "table"
                                      else click.echo, note=lambda t: click.echo(t, err=True),
                                      overrides=list(overrides), config_file=config_file)
        except KeyboardInterrupt:
            sys.exit(130)
    else:
        result = build_summary(run_dir, list(overrides), config_file=config_file)
    if fmt == "json":
        import json

        click.echo(json.dumps(result, indent=1))
    elif fmt == "csv":
        write_rows(*dict_rows(result["findings"], SUMMARY_CSV), fmt)
    else:
        click.echo(render_text(result))
    if fail_on and fails(result, fail_on):
        sys.exit(EXIT_FAIL_ON)


@main.command()
@click.argument("run_dir", type=RUN_DIR)
@click.option("-o", "--output", "out", type=RUN_DIR, default=None, metavar="OUT.html",
              help="Where to write the HTML (default ./<run-name>.html; a URL uploads it). "
                   "The analyzer never writes into a run directory unless -o says so.")
@click.option("--set", "overrides", multiple=True, metavar="DETECTOR.KEY=VALUE", help=_SET_HELP)
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None,
              help=_CONFIG_HELP)
@click.option("--watch", type=click.FloatRange(min=1), is_flag=False, flag_value=10.0,
              default=None, metavar="[SECONDS]", help="Rewrite the report every SECONDS "
              "(10) while the run is alive (the page reloads itself); stop when it ends.")
@edge
def report(run_dir: Path, out: Path | str | None, overrides: tuple[str, ...],
           config_file: Path | None, watch: float | None) -> None:
    """Write a self-contained offline HTML report of the run and print its path: by default
    ./<run-name>.html in the current directory (never into the run unless -o says so).

    \b
    Example:
      tracealyze report runs/exp1                  # writes ./exp1.html
      tracealyze report runs/exp1 -o runs/exp1/report.html
      tracealyze report runs/live --watch 30
    """
    from ..report.page import write_report

    kwargs: dict[str, Any] = {"overrides": list(overrides) or None}
    if config_file is not None:
        from ..diagnosis import thresholds as config
        from ..diagnosis.detectors.base import discover

        # resolve the file here so the report gets one merged set of thresholds
        kwargs["overrides"] = config.resolve(discover()[0], list(overrides), config_file)
    if watch is not None:
        from ..report.watch import watch_report

        try:
            path = watch_report(run_dir, out, interval_s=watch, overrides=kwargs["overrides"],
                                note=lambda t: click.echo(t, err=True))
        except KeyboardInterrupt:
            sys.exit(130)
    else:
        path = write_report(run_dir, out, progress=sys.stderr.isatty(), **kwargs)
    click.echo(str(path))


@main.command("import-trace")
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.argument("run_dir", type=RUN_DIR)
@click.option("--keep-raw", is_flag=True,
              help="Also keep a copy of each raw trace under RUN_DIR/traces/ (for Perfetto).")
@click.option("--max-ratio", type=float, default=200.0, show_default=True,
              help="Refuse a gzip trace that expands more than this many times (a "
                   "decompression bomb); 0 turns the check off.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Traces read at once (default: the CPU count, at most 4; each reader "
                   "needs about 0.5 GB).")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines on stderr.")
@edge
def import_trace(traces: tuple[Path, ...], run_dir: Path, keep_raw: bool,
                 max_ratio: float, jobs: int | None, quiet: bool) -> None:
    """Import torch.profiler / Kineto traces (.json or .json.gz files, or directories of
    them: one per rank) into RUN_DIR.

    Traces are streamed (memory stays flat whatever their size) into the trace_events
    table (GPU time breakdown per rank and step, gpu_idle, host_sync, top_ops, straggler
    findings). A trace's rank is its distributedInfo.rank, else a rank in its file name
    (rank3, worker_3), else 0.

    \b
    Example:
      tracealyze import-trace prof/worker0.pt.trace.json.gz runs/exp1
      tracealyze import-trace prof/ runs/exp1        # every rank's trace in prof/
    """
    try:
        from ..ingest.importer import import_traces
        from ..ingest.stream import Limits
    except ImportError as e:
        raise BadInput(f"trace import is not available in this installation ({e})") from e
    if max_ratio < 0:
        raise BadInput(f"--max-ratio must be ≥ 0, got {max_ratio:g}")
    limits = Limits(max_ratio=max_ratio or None)
    started = time.monotonic()

    def progress(done: int, total: int, path: Path, info: object) -> None:
        if not quiet and total > 1:
            click.echo(f"[{done}/{total}] read {path} (rank {getattr(info, 'rank', '?')}, "
                       f"{getattr(info, 'events', 0):,} events, "
                       f"{time.monotonic() - started:.1f} s)", err=True)

    from ..run.remote import into_store  # (a URL: imported into its mirror, then uploaded)

    skipped: list[Path] = []

    def into(target: Path) -> list[dict[str, Any]]:
        return import_traces(list(traces), target, keep_raw=keep_raw, limits=limits,
                             jobs=jobs, progress=progress, skipped=skipped)
    results = into_store(run_dir, into) if isinstance(run_dir, str) else into(run_dir)
    for path in skipped:
        click.echo(f"warning: skipped {path}: not a profiler trace (no traceEvents)", err=True)
    for info in results:
        parts = [f"{k}={v}" for k, v in info.items() if k != "path"]
        click.echo(f"imported {info.get('path', '')} " + " ".join(parts))
    if len(results) > 1:
        ranks = {r["rank"] for r in results}
        click.echo(f"{len(results)} traces, {len(ranks)} ranks, "
                   f"{sum(r['events'] for r in results):,} events into {run_dir} "
                   f"in {time.monotonic() - started:.1f} s")


@main.command()
@click.argument("base", type=RUN_DIR)
@click.argument("new", type=RUN_DIR)
@format_options("compared metric")
@click.option("--fail-on", type=click.Choice(["regression"]), default=None,
              help="Exit 1 on a significant change in the wrong direction beyond --threshold.")
@click.option("--threshold", type=float, default=5.0, show_default=True,
              help="Smallest change, in percent, that counts toward the verdict.")
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=None,
              help="Also write the comparison as one HTML page (curves, distributions, "
                   "kernel diff).")
@edge
def compare(base: Path, new: Path, fmt: str, fail_on: str | None,
            threshold: float, out: Path | None) -> None:
    """Did NEW train worse than BASE? Step time, throughput, data wait, memory, loss,
    gradient norms, GPU time and kernels (when both have profiler traces) and findings,
    each judged against the runs' own noise, and a verdict (regressed, improved,
    unchanged or mixed).

    \b
    Example:
      tracealyze compare runs/before runs/after -o compare.html
      tracealyze compare runs/before runs/after --json --fail-on regression --threshold 10
    """
    import json as json_

    from ..compare import runs as cmp
    from ..report.progress import Progress

    bar = Progress(total=len(cmp.STAGES), enabled=True, desc="compare")
    try:  # (a bar on a terminal, after a second; nothing when stderr is piped)
        if out is not None:
            from ..compare.page import write_compare_report

            path, result = write_compare_report(base, new, out, threshold=threshold,
                                                progress=bar)
        else:
            result = cmp.compare_runs(base, new, threshold=threshold, progress=bar)
    finally:
        bar.finish()
    if out is not None:
        click.echo(f"wrote {path}", err=True)
    if fmt == "csv":
        write_rows(*dict_rows(result["metrics"], COMPARE_CSV), fmt)
    else:
        click.echo(json_.dumps(result, indent=2, allow_nan=False, default=str)
                   if fmt == "json" else cmp.render_text(result))
    if fail_on and cmp.fails(result, fail_on):
        sys.exit(EXIT_FAIL_ON)


for _command in (fleet, record, upload):
    main.add_command(_command)

if __name__ == "__main__":  # pragma: no cover (after every command is registered)
    main()
