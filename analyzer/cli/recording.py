"""The recording side's commands: ``record`` (an unmodified script under the recorder) and
``upload`` (what a killed run left in its spool)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from tracealyze.format.vocabulary import PRESETS

from .edge import RUN_DIR, BadInput, edge


@click.command()
@click.argument("spool", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--timeout", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="Seconds to keep retrying a store that refuses.")
@edge
def upload(spool: Path, timeout: float) -> None:
    """Upload (then delete) the spool of a run recorded to a URL whose process died before
    its last upload; the spool names its URL.

    \b
    Example:
      tracealyze upload /tmp/tracealyze-spool/5f0c2a...
    """
    from tracealyze.format.spool import remove_spool, upload_spool
    try:
        url, sent = upload_spool(spool, timeout)
    except ValueError as e:
        raise BadInput(str(e)) from e
    remove_spool(spool)
    click.echo(f"uploaded {sent:,} bytes to {url}")


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--run-dir", type=RUN_DIR, default=None,
              help="Where to write (default runs/<script>-<date-time>).")
@click.option("--preset", type=click.Choice(PRESETS),
              default="standard", show_default=True, help="Recorder preset.")
@click.option("--set", "sets", multiple=True, metavar="KNOB=VALUE",
              help="Override a recorder knob (repeatable), e.g. --set grad_norm_every=10.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
@edge
def record(run_dir: Path | None, preset: str, sets: tuple[str, ...],
           command: tuple[str, ...]) -> None:
    """Run an unmodified training COMMAND under the recorder.

    Finds the model and optimizer by itself (transformers and Lightning Trainers get their
    callback), records every optimizer step, passes signals on, and exits with the
    command's exit code. Works under torchrun (one run directory, one folder per rank).

    \b
    Example:
      tracealyze record --run-dir runs/exp1 -- python train.py --epochs 3
      tracealyze record -- torchrun --nproc-per-node 2 train.py
    """
    from .. import record as rec

    knobs = rec.parse_set(sets)
    rec.check_knobs(preset, knobs)
    rec.check_command(command)
    target = run_dir if run_dir is not None else rec.default_run_dir(command)
    code = rec.record(command, run_dir=target, preset=preset, knobs=knobs)
    recorded = rec.recorded_in(target)
    click.echo(f"tracealyze: {'recorded ' + str(target) if recorded else 'nothing recorded'}"
               f" (exit code {code})" + ("" if recorded else
                                         ": no optimizer stepped in the command, or the "
                                         "recorder could not start (see above)"), err=True)
    sys.exit(code)
