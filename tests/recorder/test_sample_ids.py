"""Sample ids per step: the indices a DataLoader's sampler drew for each step's batches
(workers, persistent workers, shuffling, epochs, accumulation), checked against the ids
the dataset put in the batches themselves; findings about a step name its samples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import torch
from rec_helpers import FAST
from torch.utils.data import DataLoader, Dataset, IterableDataset
from tracealyze.recorder import Recorder

CLI = [sys.executable, "-c", "from tracealyze.analyzer.cli import main; main()"]


class Indexed(Dataset):
    """Sample i carries its own index; ``poison`` maps an index to a scale of its input."""

    def __init__(self, n: int = 96, poison: dict[int, float] | None = None) -> None:
        self.n, self.poison = n, poison or {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, generator=g) * self.poison.get(i, 1.0)
        return x, x[:2].sum().unsqueeze(0), i


def _steps(run: Path) -> list[dict]:
    rows = ds.dataset(run / "steps", partitioning="hive").to_table().to_pylist()
    return sorted(rows, key=lambda r: r["step"])


def _loop(run: Path, loader, epochs: int = 1, accumulate: int = 1, **knobs) -> list[list[int]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    truth, current = [], []
    with Recorder(run, model=model, optimizer=opt, **{**FAST, **knobs}) as rec:
        for _ in range(epochs):
            for k, (x, y, idx) in enumerate(rec.wrap_loader(loader), start=1):
                ((model(x) - y) ** 2).mean().backward()
                current += idx.tolist()
                if k % accumulate == 0:
                    opt.step()
                    opt.zero_grad()
                    rec.step(loss=((model(x) - y) ** 2).mean().detach())
                    truth.append(current)
                    current = []
    return truth


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_ids_are_the_batches_own(tmp_path: Path, workers: int, persistent: bool) -> None:
    loader = DataLoader(Indexed(), batch_size=8, shuffle=True, num_workers=workers,
                        persistent_workers=persistent,
                        generator=torch.Generator().manual_seed(1))
    truth = _loop(tmp_path / "run", loader, epochs=2)
    rows = _steps(tmp_path / "run")
    assert len(rows) == len(truth) == 24
    assert [r["sample_ids"] for r in rows] == truth


def test_micro_batches_add_up_and_the_knob_turns_it_off(tmp_path: Path) -> None:
    loader = DataLoader(Indexed(), batch_size=4, shuffle=True)
    truth = _loop(tmp_path / "acc", loader, accumulate=3)
    assert [r["sample_ids"] for r in _steps(tmp_path / "acc")] == truth
    assert all(len(t) == 12 for t in truth)
    _loop(tmp_path / "off", DataLoader(Indexed(), batch_size=8), record_sample_ids=False)
    assert all(r["sample_ids"] is None for r in _steps(tmp_path / "off"))


def test_an_iterable_dataset_has_no_ids(tmp_path: Path) -> None:
    class Stream(IterableDataset):
        def __iter__(self):
            for i in range(40):
                yield torch.randn(8), torch.randn(1), i

    _loop(tmp_path / "run", DataLoader(Stream(), batch_size=8))
    rows = _steps(tmp_path / "run")
    assert len(rows) == 5 and all(r["sample_ids"] is None for r in rows)


def test_a_nan_sample_is_named_and_the_ids_join_in_sql(tmp_path: Path) -> None:
    bad = 37
    loader = DataLoader(Indexed(poison={bad: float("nan")}), batch_size=8, shuffle=True,
                        generator=torch.Generator().manual_seed(3))
    truth = _loop(tmp_path / "run", loader)
    step = next(i for i, ids in enumerate(truth) if bad in ids)
    out = subprocess.run([*CLI, "summary", str(tmp_path / "run"), "--json"],
                         capture_output=True, text=True)
    finding = next(f for f in json.loads(out.stdout)["findings"] if f["id"] == "nonfinite")
    assert finding["first_step"] == step
    assert bad in finding["evidence"]["sample_ids"][str(step)]
    sql = ("SELECT step FROM (SELECT step, unnest(sample_ids) AS id FROM steps) "
           f"WHERE id = {bad}")
    got = subprocess.run([*CLI, "query", str(tmp_path / "run"), sql, "--format", "csv"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert got == ["step", str(step)]
    rep = subprocess.run([*CLI, "report", str(tmp_path / "run"), "-o",
                          str(tmp_path / "r.html")], capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr


def test_a_loss_spike_names_the_samples_of_its_steps(tmp_path: Path) -> None:
    bad = 11  # one sample 40x larger: every epoch, its step's loss jumps
    loader = DataLoader(Indexed(n=256, poison={bad: 40.0}), batch_size=8, shuffle=True,
                        generator=torch.Generator().manual_seed(5))
    truth = _loop(tmp_path / "run", loader, epochs=3)
    spiky = {i for i, ids in enumerate(truth) if bad in ids}
    out = subprocess.run([*CLI, "summary", str(tmp_path / "run"), "--json"],
                         capture_output=True, text=True)
    finding = next(f for f in json.loads(out.stdout)["findings"] if f["id"] == "loss_spike")
    ev = finding["evidence"]
    assert finding["first_step"] in spiky and ev["worst_step"] in spiky
    assert all(bad in ids for ids in ev["sample_ids"].values())
