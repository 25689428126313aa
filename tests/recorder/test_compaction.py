"""The writer merges small parts as it goes (size-tiered), so a run killed after thousands of
flushes leaves a few dozen files per table, every row exactly once, and a kill at any point of
a merge duplicates nothing."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
from tracealyze.format.parts import COMPACT_FANOUT, compact, data_parts, top_level
from tracealyze.recorder.write.writer import Writer


def _writer(run_dir: Path, fanout: int = COMPACT_FANOUT) -> Writer:
    return Writer(run_dir, 0, flush_interval_s=3600.0, flush_rows=10**9, queue_size=10,
                  max_buffered_rows=10**9, compact_fanout=fanout)


def _flush_steps(w: Writer, first: int, n: int) -> None:
    for s in range(first, first + n):
        w.append("steps", {"step": np.array([s]), "time": np.array([time.time()]),
                           "loss": np.array([1.0 / (s + 1)])})
        w.flush()


def _steps_in(folder: Path) -> list[int]:
    import pyarrow.parquet as pq

    return sorted(s for p in data_parts(folder)
                  for s in pq.read_table(p, columns=["step"]).column("step").to_pylist())


def test_file_count_stays_logarithmic_and_rows_exact(tmp_path: Path) -> None:
    run = tmp_path / "run"
    w = _writer(run, fanout=4)
    try:
        _flush_steps(w, 0, 700)
        folder = run / "steps" / "rank=0"
        files = data_parts(folder)
        # fanout 4: at most 3 singles + 3 files per level beyond, 700 < 4**5
        assert len(files) <= 3 + 3 * 5, len(files)
        assert len(list(folder.iterdir())) == len(files)  # merged inputs were deleted
        assert _steps_in(folder) == list(range(700))
    finally:
        w.close()


def test_killed_mid_merge_counts_rows_once(tmp_path: Path) -> None:
    """A kill between a merge's rename and its deletes leaves the merged part and the parts
    it covers: readers skip what it covers, and the next compaction deletes them."""
    run = tmp_path / "run"
    w = _writer(run, fanout=0)  # no compaction: single parts only
    _flush_steps(w, 0, 20)
    w.close()
    folder = run / "steps" / "rank=0"
    saved = tmp_path / "saved"
    shutil.copytree(folder, saved)
    compact(folder, "steps", fanout=8)  # merges 20 singles into one
    for p in saved.iterdir():  # the inputs are back, as if the deletes never happened
        shutil.copy(p, folder / p.name)
    kept, covered = top_level(folder)
    assert len(kept) == 1 and len(covered) == 20
    assert _steps_in(folder) == list(range(20))
    from tracealyze.analyzer.run.catalog import open_run
    from tracealyze.format.parts import write_json_atomic
    from tracealyze.format.runmeta import new_run_meta

    write_json_atomic(run / "run.json", new_run_meta(preset=None, knobs=None, world_size=1,
                                                     status="completed"))
    with open_run(run) as r:
        assert r.query("SELECT count(*), count(DISTINCT step) FROM steps")[1] == [(20, 20)]
    compact(folder, "steps", fanout=8)
    assert len(list(folder.iterdir())) == 1


def test_merge_at_close_leaves_one_file(tmp_path: Path) -> None:
    from tracealyze.recorder.write.writer import merge_parts

    run = tmp_path / "run"
    w = _writer(run, fanout=4)
    _flush_steps(w, 0, 50)
    w.close()
    merge_parts(run, 0)
    folder = run / "steps" / "rank=0"
    assert len(list(folder.iterdir())) == 1 and _steps_in(folder) == list(range(50))
