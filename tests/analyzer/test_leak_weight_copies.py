"""A host leak made of copies of the model's weights names its unit (held-out ah_textcnn: a
snapshot-ensemble typo kept a 714 KiB state_dict copy every step; ah_ddpm: one every 50
steps): the rises are the model's parameter bytes, which run.json knows. A leak of another
unit (a kept graph) is not called a copy."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run

N = 400
PARAMS = 182_854  # float32: 714 KiB


def _leak(tmp_path, unit: float, every: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    s = np.arange(N)
    kept = np.where(s >= 100, (s - 100) // every + 1, 0)
    heap = 130 * 2**20 + unit * kept + rng.normal(0, 512, N)
    run = make_run(tmp_path, steps=N, heap=heap, rss=heap + 300 * 2**20,
                   run_meta={"model": {"parameters": PARAMS, "dtypes": ["float32"]}})
    (f,) = [x for x in build_summary(run)["findings"] if x["id"] == "memory_leak"]
    return f


@pytest.mark.parametrize("every", [1, 25])
@pytest.mark.parametrize("seed", range(2))
def test_copies_of_the_weights_are_named(tmp_path, every, seed):
    f = _leak(tmp_path, 4 * PARAMS * 1.02, every, seed)  # (+2%: the dict's own objects)
    c = f["evidence"]["weight_copies"]
    assert c["every"] == every and c["param_bytes"] == 4 * PARAMS
    assert "size of the model's parameters" in f["message"]


def test_a_leak_of_another_unit_is_not_called_a_copy(tmp_path):
    f = _leak(tmp_path, 14 * 1024, 1, 0)  # a kept graph: 14 KiB a step
    assert "weight_copies" not in f["evidence"]
    assert "size of the model's parameters" not in f["message"]
