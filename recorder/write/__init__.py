"""How it is written: the background writer and its crash-safe Parquet parts (``writer``),
committed steps turned into rows (``rows``) held per table until a flush (``buffers``), the
run directory claimed and kept (``rundir``) with one writer per rank folder (``ranklock``),
run.json (``runmeta``), the Arrow schemas of the format (``schema``), and the findings handed
to MLflow or wandb at close (``report_to``)."""

from __future__ import annotations

from .. import lazy_exports

_EXPORTS = {
    "Writer": ".writer",
    "merge_parts": ".writer",
    "StepRows": ".rows",
    "TableBuffer": ".buffers",
    "RunDir": ".rundir",
    "RankLock": ".ranklock",
    "new_run_meta": ".runmeta",
    "Reporter": ".report_to",
}
"""Public name -> the module that defines it (imported on first use)."""

__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
