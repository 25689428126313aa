"""Where the per-run analyses run: local processes (the default) or Spark tasks.

Each analysis (:func:`.analyse.analyse_run`) is independent and returns plain values, so
an engine only maps it over the runs and collects the results; the driver then writes the
index. Both engines give the same rows (sorted by path by the index).
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .discover import RunRef

Progress = Callable[[int, int], None]


def _task(item: tuple[str, str]) -> dict[str, Any]:
    from .analyse import analyse_run

    return analyse_run(*item)


def run_local(refs: Sequence[RunRef], jobs: int | None, progress: Progress | None = None
              ) -> list[dict[str, Any]]:
    """Analyse ``refs`` in ``jobs`` processes (default: one per CPU core; 1: in this
    process). Worker processes start from a fresh interpreter (``forkserver``): no DuckDB
    thread pool or open connection of this process is forked half-way."""
    items = [(r.path, r.fingerprint) for r in refs]
    jobs = jobs or os.cpu_count() or 1
    out: list[dict[str, Any]] = []
    if jobs == 1 or len(items) < 2:
        for i, item in enumerate(items, start=1):
            out.append(_task(item))
            if progress:
                progress(i, len(items))
        return out
    with ProcessPoolExecutor(max_workers=min(jobs, len(items)),
                             mp_context=get_context("forkserver")) as ex:
        futures = {ex.submit(_task, item): item for item in items}
        for i, fut in enumerate(as_completed(futures), start=1):
            try:
                out.append(fut.result())
            except Exception as e:  # the worker died (killed, out of memory): that run's
                # row says so, and the others go on (a broken pool fails the rest likewise)
                from .analyse import failed

                out.append(failed(futures[fut][0], f"its analysis did not finish "
                                                   f"({type(e).__name__}: {e})"))
            if progress:
                progress(i, len(items))
    return out


def package_zip() -> Path:
    """The analyzer's own Python as a zip for Spark executors (``addPyFile``): every
    ``.py`` file and template of the installed ``tracealyze`` packages, nothing else
    (``tracealyze`` is a namespace package: each sub-package is found where it lives)."""
    import importlib
    import io

    from ..writes import Dir, private_dir

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, mode="w", compression=zipfile.ZIP_DEFLATED) as z:
        for sub in ("format", "recorder", "analyzer", "templates"):
            mod = importlib.import_module(f"tracealyze.{sub}")
            root = Path(mod.__file__ or "").resolve().parent
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = [d for d in dirnames if d != "__pycache__"]
                for name in filenames:
                    if name.endswith((".py", ".j2", ".css", ".js", ".txt")):
                        f = Path(dirpath) / name
                        z.write(f, Path("tracealyze") / sub / f.relative_to(root))
    with Dir.open(private_dir(prefix="tracealyze-spark-")) as d:
        return d.write_atomic("tracealyze.zip", buf.getvalue())


def run_spark(refs: Sequence[RunRef], master: str | None, jobs: int | None,
              progress: Progress | None = None) -> list[dict[str, Any]]:
    """Analyse ``refs`` as Spark tasks: in the active SparkSession (Databricks,
    ``spark-submit``) if there is one, else in one started on ``master`` (default
    ``local[*]``) and stopped afterwards. The analyzer's code is shipped to the executors."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise ConfigError("--engine spark needs pyspark: pip install pyspark") from None
    spark = SparkSession.getActiveSession()
    own = spark is None
    if own:
        builder = SparkSession.builder.appName("tracealyze fleet")
        if master is None and os.environ.get("PYSPARK_GATEWAY_PORT"):
            master = ""  # under spark-submit: its --master, from the session's conf
        master = "local[*]" if master is None else master
        if master:
            builder = builder.master(master)
        if master.startswith("local"):  # a batch job on this machine: no UI, no LAN
            builder = (builder.config("spark.ui.enabled", "false")
                       .config("spark.driver.bindAddress", "127.0.0.1"))
        spark = builder.getOrCreate()
    try:
        sc = spark.sparkContext
        sc.addPyFile(str(package_zip()))
        items = [(r.path, r.fingerprint) for r in refs]
        if not items:
            return []
        slices = max(1, min(len(items), jobs or sc.defaultParallelism * 4))
        out = sc.parallelize(items, slices).map(_task).collect()
        if progress:
            progress(len(out), len(items))
        return out
    finally:
        if own:
            spark.stop()


def run(engine: str, refs: Sequence[RunRef], *, jobs: int | None = None,
        spark_master: str | None = None, progress: Progress | None = None
        ) -> list[dict[str, Any]]:
    if engine == "local":
        return run_local(refs, jobs, progress)
    if engine == "spark":
        return run_spark(refs, spark_master, jobs, progress)
    raise ConfigError(f"unknown engine {engine!r} (local or spark)")
