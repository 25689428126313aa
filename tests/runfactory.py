"""Write synthetic run directories exactly as docs/FORMAT.md describes, for tests: through
``tracealyze.format`` (part names, atomic Parquet writes, run.json and rank files), as the
recorder writes them, so a change to the format is a change here too.

High level::

    from tests.runfactory import make_run
    run = make_run(tmp_path, steps=200, tensors=4, loss=lambda s: 2.0 * 0.99 ** s,
                   rss=lambda s: 1e9 + 1e6 * s)

Every per-step series argument (``loss``, ``duration``, ``data_wait``, ``grad_norm``, ``lr``,
``rss``, ``cuda_allocated``, ...) accepts:

* ``None``: the column is null (or a healthy default where noted),
* a number: constant,
* a sequence / numpy array of length ``steps``,
* a callable ``f(steps: np.ndarray) -> array-like`` (vectorised over the int64 step numbers),
* a dict ``{rank: <any of the above>}`` for per-rank values (missing ranks use the default).

Low level: :func:`write_part` writes one part file of any table, filling missing columns with
nulls and casting to the FORMAT.md types; :func:`truncate_part` corrupts one;
:func:`write_run_json` / :func:`write_rank_json` write the metadata files.
"""

from __future__ import annotations

import itertools
import time as _time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tracealyze.analyzer.sql.schema import TABLES, arrow_schema
from tracealyze.format.parts import (
    merged_name,
    part_name,
    rank_dir,
    write_json_atomic,
    write_parquet_atomic,
)
from tracealyze.format.runmeta import new_rank_meta, new_run_meta

Series = None | float | int | Sequence[float] | np.ndarray | Callable[[np.ndarray], Any]


# ---------------------------------------------------------------- low level


def to_arrow(table: str, rows: Any) -> pa.Table:
    """Rows (list of dicts, dict of columns, or pa.Table) as a pa.Table of ``table``'s schema.

    Missing columns become nulls; extra columns are kept (the format allows more columns).
    """
    schema = arrow_schema(table)
    if isinstance(rows, pa.Table):
        data = rows
    elif isinstance(rows, Mapping):
        data = pa.table({k: _as_array(v) for k, v in rows.items()})
    else:
        rows = list(rows)
        names: list[str] = []
        for r in rows:
            names.extend(k for k in r if k not in names)
        data = pa.table({k: [r.get(k) for r in rows] for k in names}) if names else pa.table({})
    n = data.num_rows
    arrays, fields = [], []
    for field in schema:
        if field.name in data.column_names:
            col = data.column(field.name)
            arrays.append(col.cast(field.type) if col.type != field.type else col)
        else:
            arrays.append(pa.nulls(n, field.type))
        fields.append(field)
    for name in data.column_names:
        if name not in schema.names:
            arrays.append(data.column(name))
            fields.append(data.schema.field(name))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _as_array(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return pa.array(v)  # NaN stays NaN (not null) for floats
    return v


def part_path(run_dir: Path, table: str, rank: int, seq: int | tuple[int, int]) -> Path:
    """Path of part ``seq`` (or merged ``(a, b)``) of ``table`` for ``rank``."""
    name = merged_name(*seq) if isinstance(seq, tuple) else part_name(seq)
    return rank_dir(Path(run_dir), table, rank) / name


def write_part(
    run_dir: Path | str,
    table: str,
    rank: int,
    rows: Any,
    seq: int | tuple[int, int] = 1,
    *,
    fill_rank: bool = True,
    rank_column: bool = False,
) -> Path:
    """Write one part file (``seq`` int → ``part-<seq>``, tuple (a, b) → merged ``part-a-b``).

    ``rows`` is a list of dicts, a dict of columns or a pa.Table. ``rank`` fills the rank column
    when it is missing (``fill_rank``). zstd + dictionary encoding as the recorder writes.
    """
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}")
    data = to_arrow(table, rows)
    if fill_rank and data.column("rank").null_count == data.num_rows:
        idx = data.schema.get_field_index("rank")
        data = data.set_column(idx, "rank", pa.array(np.full(data.num_rows, rank, np.int32)))
    if not rank_column:  # schema_version 2: the rank is the folder, not a column
        data = data.drop_columns(["rank"])
    path = part_path(Path(run_dir), table, rank, seq)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_parquet_atomic(data, path)


def truncate_part(path: Path | str, keep: float = 0.5) -> Path:
    """Cut a part file to ``keep`` of its bytes (a torn write; footer gone)."""
    path = Path(path)
    data = path.read_bytes()
    path.write_bytes(data[: max(1, int(len(data) * keep))])
    return path


def write_run_json(run_dir: Path | str, **fields: Any) -> dict[str, Any]:
    """Write run.json: the format's new run, finished an hour after it started on a fixed
    test host, with ``fields`` overriding/extending it."""
    now = _time.time()
    meta = new_run_meta(preset="standard", knobs={}, world_size=1, status="completed")
    meta.update({
        "started": now - 3600.0,
        "started_iso": "",
        "ended": now,
        "status": "completed",
        "heartbeat": now,
        "flush_interval_s": 10.0,
        "host": "testhost",
        "pid": 1234,
        "world_size": 1,
        "versions": {"python": "3.11", "torch": "2.13.0", "tracealyze": "0.1.0", "cuda": None},
        "preset": "standard",
        "knobs": {},
        "model": {"class": "Synthetic", "parameters": 0, "trainable_parameters": 0,
                  "tensors": 0, "dtypes": ["float32"], "devices": ["cpu"]},
        "device": {"type": "cpu", "name": "cpu", "total_memory_bytes": None},
        "resumes": [],
        "counters": {"dropped": {}, "recorder_errors": 0},
    })
    # (machine-dependent, and older recorders wrote neither: a test that needs them says so)
    meta.pop("source", None)
    meta.pop("cpu_count", None)
    meta.update(fields)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "run.json", meta)
    return meta


def write_rank_json(run_dir: Path | str, rank: int, **fields: Any) -> dict[str, Any]:
    """Write ranks/rank=<r>.json (status, heartbeat, counters ...)."""
    now = _time.time()
    meta = new_rank_meta(rank, "testhost")
    meta.update({"status": "completed", "started": now - 3600.0, "ended": now,
                 "heartbeat": now, "pid": 1234 + rank})
    meta.update(fields)
    d = Path(run_dir) / "ranks"
    d.mkdir(parents=True, exist_ok=True)
    write_json_atomic(d / f"rank={rank}.json", meta)
    return meta


# ---------------------------------------------------------------- high level


def series(spec: Any, steps: np.ndarray, rank: int = 0, default: Any = None) -> np.ndarray | None:
    """Evaluate a series spec (see module doc) over ``steps``; None → ``default`` → null."""
    if isinstance(spec, Mapping):
        spec = spec.get(rank, default)
    if spec is None:
        spec = default
    if spec is None:
        return None
    if callable(spec):
        out = np.asarray(spec(steps), dtype=np.float64)
    elif np.isscalar(spec):
        out = np.full(len(steps), float(spec))
    else:
        out = np.asarray(spec, dtype=np.float64)
    if out.shape == ():
        out = np.full(len(steps), float(out))
    if len(out) != len(steps):
        raise ValueError(f"series has {len(out)} values for {len(steps)} steps")
    return out


def _split(n: int, parts: int) -> list[slice]:
    edges = np.linspace(0, n, parts + 1).astype(int)
    return [slice(int(a), int(b)) for a, b in itertools.pairwise(edges) if b > a]


def _write_table_parts(run_dir: Path, table: str, rank: int, data: pa.Table, parts: int,
                       merged: bool, step_col: str | None = "step") -> list[Path]:
    """Write ``data`` as ``parts`` parts (split by row blocks), or one merged part."""
    if data.num_rows == 0:
        return []
    if merged:
        return [write_part(run_dir, table, rank, data, (1, parts))]
    out = []
    for i, sl in enumerate(_split(data.num_rows, parts), start=1):
        out.append(write_part(run_dir, table, rank, data.slice(sl.start, sl.stop - sl.start), i))
    return out


def default_tensor_names(n: int) -> list[str]:
    """``n`` parameter names in model order: layers.<i>.weight / layers.<i>.bias pairs."""
    return [f"layers.{i // 2}.{'weight' if i % 2 == 0 else 'bias'}" for i in range(n)]


def make_run(
    root: Path | str,
    *,
    name: str = "run",
    steps: int | Sequence[int] = 100,
    ranks: int | Sequence[int] = 1,
    status: str = "completed",
    seed: int = 0,
    step_time: float = 0.1,
    loss: Any = "default",
    lr: Any = 1e-3,
    grad_norm: Any = "default",
    duration: Any = "default",
    data_wait: Any = "default",
    nonfinite_grads: Any = 0,
    loss_scale: Any = None,
    grad_clip_max: Any = None,
    cpu: Any = None,
    cpu_queue: Any = None,
    tokens_per_s: Any = None,
    new_shapes: Any = None,
    tensors: int | Sequence[str] = 0,
    tensor_kinds: Sequence[str] = ("grad", "param", "update"),
    tensor_norm: Callable[[np.ndarray, str, str], Any] | None = None,
    tensor_every: int = 1,
    activations: Sequence[str] = (),
    activation_stats: Callable[[np.ndarray, str], Mapping[str, Any]] | None = None,
    activation_every: int = 1,
    rss: Any = "default",
    heap: Any = None,
    cuda_allocated: Any = None,
    cuda_reserved: Any = None,
    cuda_alloc_retries: Any = None,
    cuda_total: int | None = None,
    memory_every: int = 1,
    metrics: Mapping[str, Any] | None = None,
    events: Iterable[Mapping[str, Any]] = (),
    system: bool | Mapping[str, float] = False,
    parts: int = 1,
    merged: bool = False,
    heartbeat_age_s: float = 0.0,
    run_meta: Mapping[str, Any] | None = None,
    hosts: Mapping[int, str] | None = None,
    tensor_ranks: Sequence[int] | None = None,
) -> Path:
    """Create ``root/name`` as a complete run directory and return its path.

    Defaults give a *healthy* run: loss decaying with small noise, steady step times with a
    small data wait, flat RSS, healthy grad/param/update norms. Pass a series spec to inject a
    pathology. ``tensors`` is a count (names from :func:`default_tensor_names`) or names in
    model order; ``tensor_norm(steps, name, kind)`` overrides per-tensor norms (return None to
    keep the default for that tensor/kind). ``activations`` are module paths in forward
    (post-)order, written as kind=activation rows with ``seq`` (every
    ``activation_every``-th tensor step, as the debug preset's activation statistics);
    ``activation_stats(steps, name)`` may return column arrays (``norm``, ``nonfinite``,
    ``zero_frac`` ...).
    ``grad_clip_max`` fills ``steps.grad_clip_max`` (NaN: no clip at that step).
    ``cpu`` / ``cpu_queue`` fill ``steps.cpu_s`` / ``cpu_queue_s`` (default: absent, as
    in a run recorded before they were); ``tokens_per_s`` fills ``steps.tokens_per_s``
    (default: absent, as when the recorder was given no token counts), ``new_shapes``
    ``steps.new_shapes`` (default: absent, as without a model). ``status``
    running/crashed/completed; ``heartbeat_age_s`` ages the heartbeat (a killed run).
    ``events`` are event rows (``rank`` defaults to 0). ``parts`` splits each table into that
    many part files, ``merged`` writes one merged ``part-1-<parts>`` instead. ``hosts``
    names each rank's host (rank files; default ``testhost``); ``tensor_ranks`` the ranks
    that write tensor statistics (default all; under DDP the recorder writes them on rank 0
    only).
    """
    rng = np.random.default_rng(seed)
    run_dir = Path(root) / name
    run_dir.mkdir(parents=True, exist_ok=False)
    step_arr = (np.arange(int(steps), dtype=np.int64) if isinstance(steps, int)
                else np.asarray(steps, dtype=np.int64))
    rank_list = list(range(ranks)) if isinstance(ranks, int) else list(ranks)
    names = default_tensor_names(tensors) if isinstance(tensors, int) else list(tensors)
    n = len(step_arr)
    now = _time.time()
    heartbeat = now - heartbeat_age_s
    t0 = heartbeat - n * step_time - 1.0

    for rank in rank_list:
        noise = rng.normal(0.0, 1.0, n)
        dur = series(duration, step_arr, rank) if not isinstance(duration, str) else (
            step_time * (1.0 + 0.02 * np.abs(noise)))
        wait = series(data_wait, step_arr, rank) if not isinstance(data_wait, str) else (
            0.02 * step_time * (1.0 + 0.1 * np.abs(rng.normal(0, 1, n))))
        los = series(loss, step_arr, rank) if not (isinstance(loss, str)) else (
            2.0 * np.exp(-step_arr / max(n, 1) * 2.0) + 0.3 + 0.01 * rng.normal(0, 1, n))
        gn = series(grad_norm, step_arr, rank) if not isinstance(grad_norm, str) else (
            1.0 + 0.05 * rng.normal(0, 1, n))
        times = t0 + np.cumsum(dur if dur is not None else np.full(n, step_time))
        nfg = series(nonfinite_grads, step_arr, rank)
        steps_tbl = {
            "rank": np.full(n, rank, np.int32),
            "step": step_arr,
            "time": times,
            "duration_s": dur if dur is not None else pa.nulls(n, pa.float64()),
            "data_wait_s": wait if wait is not None else pa.nulls(n, pa.float64()),
            "loss": los if los is not None else pa.nulls(n, pa.float64()),
            "lr": series(lr, step_arr, rank) if lr is not None else pa.nulls(n, pa.float64()),
            "grad_norm": gn if gn is not None else pa.nulls(n, pa.float64()),
            "nonfinite_grads": (nfg.astype(np.int32) if nfg is not None
                                else pa.nulls(n, pa.int32())),
        }
        if loss_scale is not None:
            steps_tbl["loss_scale"] = series(loss_scale, step_arr, rank)
        for col, spec in (("grad_clip_max", grad_clip_max), ("cpu_s", cpu),
                          ("cpu_queue_s", cpu_queue),
                          ("tokens_per_s", tokens_per_s), ("new_shapes", new_shapes)):
            if spec is not None:
                steps_tbl[col] = series(spec, step_arr, rank)
                if col == "new_shapes":
                    steps_tbl[col] = np.asarray(steps_tbl[col]).astype(np.int32)
        _write_table_parts(run_dir, "steps", rank, to_arrow("steps", steps_tbl), parts, merged)

        # memory
        mem_steps = step_arr[::memory_every]
        m = len(mem_steps)
        rss_v = series(rss, mem_steps, rank) if not isinstance(rss, str) else (
            1.5e9 + 2e6 * rng.normal(0, 1, m))
        mem: dict[str, Any] = {
            "rank": np.full(m, rank, np.int32), "step": mem_steps,
            "time": times[::memory_every],
        }
        for col, spec in (("rss_bytes", rss_v), ("cuda_allocated_bytes", cuda_allocated),
                          ("cuda_reserved_bytes", cuda_reserved),
                          ("cuda_alloc_retries", cuda_alloc_retries), ("heap_bytes", heap)):
            vals = spec if col == "rss_bytes" else series(spec, mem_steps, rank)
            mem[col] = vals.astype(np.int64) if vals is not None else pa.nulls(m, pa.int64())
        if cuda_total is not None:
            mem["cuda_total_bytes"] = np.full(m, cuda_total, np.int64)
        if cuda_allocated is not None:  # (read at each step's end, as the recorder does)
            mem["cuda_max_allocated_bytes"] = np.maximum.accumulate(mem["cuda_allocated_bytes"])
        _write_table_parts(run_dir, "memory", rank, to_arrow("memory", mem), parts, merged)

        # tensor stats
        ts_tables = []
        if names and (tensor_ranks is None or rank in tensor_ranks):
            ts_steps = step_arr[::tensor_every]
            k = len(ts_steps)
            for idx, tname in enumerate(names):
                base = 0.1 * (1.0 + 0.3 * (idx % 5))
                pnorm = 10.0 * (1.0 + 0.1 * (idx % 3))
                for kind in tensor_kinds:
                    custom = tensor_norm(ts_steps, tname, kind) if tensor_norm else None
                    if custom is not None:
                        norm = np.asarray(custom, dtype=np.float64)
                        if norm.shape == ():
                            norm = np.full(k, float(norm))
                    elif kind == "grad":
                        norm = base * (1.0 + 0.05 * rng.normal(0, 1, k))
                    elif kind == "param":
                        norm = np.full(k, pnorm) + 1e-4 * ts_steps
                    elif kind == "update":
                        norm = pnorm * 1e-3 * (1.0 + 0.05 * rng.normal(0, 1, k))
                    else:
                        norm = np.ones(k)
                    cols: dict[str, Any] = {
                        "rank": np.full(k, rank, np.int32), "step": ts_steps,
                        "name": pa.array([tname] * k, pa.string()),
                        "kind": pa.array([kind] * k, pa.string()),
                        "numel": np.full(k, 1000, np.int64),
                        "norm": norm.astype(np.float32),
                        "nonfinite": (~np.isfinite(norm)).astype(np.int64),
                    }
                    if kind == "update":
                        cols["ratio"] = (norm / pnorm).astype(np.float32)
                    ts_tables.append(to_arrow("tensor_stats", cols))
            act_steps = ts_steps[ts_steps % activation_every == 0]
            for seq_i, mod in enumerate(activations):
                k = len(act_steps)
                cols = {
                    "rank": np.full(k, rank, np.int32), "step": act_steps,
                    "name": pa.array([mod] * k, pa.string()),
                    "kind": pa.array(["activation"] * k, pa.string()),
                    "numel": np.full(k, 4096, np.int64),
                    "norm": np.full(k, 5.0, np.float32),
                    "zero_frac": np.full(k, 0.1, np.float32),
                    "nonfinite": np.zeros(k, np.int64),
                    "seq": np.full(k, seq_i, np.int32),
                }
                if activation_stats is not None:
                    cols.update(activation_stats(act_steps, mod) or {})
                ts_tables.append(to_arrow("tensor_stats", cols))
        if ts_tables:
            ts = pa.concat_tables(ts_tables)
            # order by step like the recorder's flushes
            ts = ts.take(pa.array(np.argsort(ts.column("step").to_numpy(), kind="stable")))
            _write_table_parts(run_dir, "tensor_stats", rank, ts, parts, merged)

        # metrics
        if metrics:
            mt = []
            for mname, spec in metrics.items():
                vals = series(spec, step_arr, rank)
                if vals is None:
                    continue
                mt.append(to_arrow("metrics", {
                    "rank": np.full(n, rank, np.int32), "step": step_arr,
                    "name": pa.array([mname] * n, pa.string()), "value": vals}))
            if mt:
                _write_table_parts(run_dir, "metrics", rank, pa.concat_tables(mt), parts, merged)

        if system:
            load = dict(system) if isinstance(system, Mapping) else {}
            sys_t = {"rank": np.full(n, rank, np.int32), "time": times,
                     "cpu_percent": np.full(n, load.get("cpu_percent", 50.0)),
                     "proc_cpu_percent": np.full(n, load.get("proc_cpu_percent", 90.0)),
                     "mem_percent": np.full(n, 30.0)}
            _write_table_parts(run_dir, "system", rank, to_arrow("system", sys_t), 1, False)

        # a crash is the first rank's; the others finished (the run's status is still crashed)
        rank_status = "completed" if status == "crashed" and rank != rank_list[0] else status
        write_rank_json(run_dir, rank, status=rank_status, heartbeat=heartbeat,
                        ended=None if status == "running" else heartbeat, steps=n,
                        host=(hosts or {}).get(rank, "testhost"))

    ev_rows = [dict({"rank": 0, "time": now, "severity": "warning", "details": "{}"}, **e)
               for e in events]
    for rank in sorted({int(e["rank"]) for e in ev_rows}):
        write_part(run_dir, "events", rank, [e for e in ev_rows if int(e["rank"]) == rank], 1)

    meta = {"status": status, "heartbeat": heartbeat, "world_size": len(rank_list),
            "ended": None if status == "running" else heartbeat,
            "started": t0}
    if cuda_total is not None:
        meta["device"] = {"type": "cuda", "name": "Synthetic GPU",
                          "total_memory_bytes": int(cuda_total)}
    meta.update(run_meta or {})
    write_run_json(run_dir, **meta)
    return run_dir


def listing(run_dir: Path | str) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime_ns)} of every file under run_dir (to prove read-only)."""
    root = Path(run_dir)
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def upload_run(local: Path, url: str) -> None:
    """Every file of the run directory ``local`` into the store at ``url``, as they are."""
    from tracealyze.format import storage

    loc = storage.locate(url)
    for f in sorted(local.rglob("*")):
        if f.is_file():
            with loc.fs.open_output_stream(f"{loc.root}/{f.relative_to(local).as_posix()}") as o:
                o.write(f.read_bytes())
