"""Hyperparameters: flattened with dots, JSON-safe and bounded (format/hparams.py), kept in
run.json by Recorder(hparams=...) and rec.log_hparams(...)."""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tracealyze.format import hparams as H
from tracealyze.recorder import Recorder


def _unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in flat.items():
        *path, last = key.split(".")
        node = out
        for p in path:
            node = node.setdefault(p, {})
        node[last] = v
    return out


_names = st.text(st.characters(codec="ascii", categories=("Ll",)), min_size=1, max_size=8) \
    .filter(lambda k: not H._secret(k))
_scalars = (st.none() | st.booleans() | st.integers(-(1 << 62), 1 << 62)
            | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30))
_values = st.recursive(
    _scalars | st.lists(_scalars.filter(lambda x: not isinstance(x, list)), max_size=5),
    lambda inner: st.dictionaries(_names, inner, min_size=1, max_size=4), max_leaves=30)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_names, _values, max_size=6))
def test_flattening_within_the_bounds_loses_nothing(config: dict[str, Any]) -> None:
    flat, dropped = H.flatten(config)
    assert dropped == 0
    assert all("." not in k.rsplit(".", 1)[-1] for k in flat)
    json.dumps(flat, allow_nan=False)  # JSON-safe as written to run.json
    assert _unflatten(flat) == config
    # the view's rows: one per key, each value read back through its type
    for key, text, typ in H.rows(flat):
        v = flat[key]
        assert typ == H.type_of(v)
        if typ in ("int", "float", "bool", "list"):
            assert json.loads(text) == v
        elif typ == "str":
            assert text == v
        else:
            assert text is None


@dataclasses.dataclass
class Opt:
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    schedule: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"name": "cosine", "warmup": 100})


class Kind(enum.Enum):
    ADAMW = "adamw"


class WithToDict:  # (transformers' configs and TrainingArguments)
    def to_dict(self) -> dict[str, Any]:
        return {"hidden_size": 64, "hub_token": "hf_secret", "max_tokens": 7}


def test_objects_flatten_through_their_fields() -> None:
    flat, _ = H.flatten({"optimizer": Opt(), "kind": Kind.ADAMW, "model": WithToDict(),
                         "args": argparse.Namespace(seed=1, path=Path("/data")),
                         "nan": math.nan, "inf": -math.inf, "obj": object()})
    assert flat["optimizer.lr"] == 3e-4 and flat["optimizer.betas"] == [0.9, 0.95]
    assert flat["optimizer.schedule.warmup"] == 100 and flat["kind"] == "adamw"
    assert (flat["model.hidden_size"], flat["model.max_tokens"]) == (64, 7)
    assert flat["model.hub_token"] == H.REDACTED  # a secret's text, never a count
    assert (flat["args.seed"], flat["args.path"]) == (1, "/data")
    assert (flat["nan"], flat["inf"]) == ("nan", "-inf")
    assert flat["obj"] == "<object object>"  # (no memory address: two runs compare equal)


def test_sizes_are_bounded() -> None:
    flat, dropped = H.flatten({f"k{i}": i for i in range(H.MAX_KEYS + 5)})
    assert len(flat) == H.MAX_KEYS and dropped == 5
    deep: dict[str, Any] = {"z": 1}
    for name in "jihgfedcba":
        deep = {name: deep}
    flat, _ = H.flatten({"vocab": list(range(1000)), "text": "x" * 5000, "deep": deep})
    assert isinstance(flat["vocab"], str) and len(flat["vocab"]) <= H.MAX_TEXT_CHARS
    assert len(flat["text"]) == H.MAX_TEXT_CHARS
    assert any(k.startswith("deep.") for k in flat) and max(
        k.count(".") for k in flat) <= H.MAX_DEPTH + 1
    loop: dict[str, Any] = {"a": 1}
    loop["self"] = loop
    assert H.flatten(loop)[0]["a"] == 1  # a config that refers to itself ends


def test_the_command_line_reads_as_options() -> None:
    got = H.from_command(["python", "train.py", "--lr", "3e-4", "--batch-size=32",
                          "--name", "run a", "--fp16", "-v", "--api-key", "sk-1"])
    assert got["command"] == ("python train.py --lr 3e-4 --batch-size=32 --name 'run a' "
                              "--fp16 -v --api-key '<redacted>'")
    assert (got["cli.lr"], got["cli.batch_size"], got["cli.name"], got["cli.fp16"],
            got["cli.api_key"]) == (3e-4, 32, "run a", True, H.REDACTED)
    assert H.from_command("python train.py") == {}  # (not an argv list)


def test_a_strangers_run_json_values_are_read_as_text() -> None:
    rows = H.rows({"a": {"nested": 1}, "b": [[1], 2], 7: "not a key", "c": None})
    assert rows == [("a", '{"nested": 1}', "str"), ("b", "[[1], 2]", "str"),
                    ("c", None, "null")]
    assert H.rows("not a mapping") == []


def test_differences_name_changed_added_and_removed_keys() -> None:
    assert H.differences({"lr": 0.1, "seed": 1, "gone": None}, {"lr": 0.05, "seed": 1,
                                                               "new": "x"}) == [
        ("gone", "null", None), ("lr", "0.1", "0.05"), ("new", None, "x")]


def _train(rec: Recorder, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for _ in range(3):
        loss = model(torch.randn(2, 4)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        rec.step(loss=loss)


def test_recorder_keeps_hparams_in_run_json_and_log_hparams_adds_to_them(
        tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(tmp_path / "r", model=model, optimizer=opt, system_interval_s=0,
                  hparams={"optimizer": {"lr": 0.1}, "seed": 1}) as rec:
        _train(rec, model, opt)
        rec.log_hparams({"data": {"tokens": 1234}, "seed": 2})
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    assert meta["hparams"] == {"optimizer.lr": 0.1, "seed": 2, "data.tokens": 1234}
    # resumed: the old values kept, new ones added
    with Recorder(tmp_path / "r", model=model, optimizer=opt, system_interval_s=0,
                  resume=True, hparams={"phase": 2}) as rec:
        _train(rec, model, opt)
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    assert meta["hparams"] == {"optimizer.lr": 0.1, "seed": 2, "data.tokens": 1234,
                               "phase": 2}


@pytest.mark.parametrize("bad", [3, "lr=0.1", [("lr", 0.1)]])
def test_hparams_that_are_not_a_mapping_are_refused_at_construction(
        tmp_path: Path, bad: Any) -> None:
    with pytest.raises(ValueError, match="hparams must be a mapping"):
        Recorder(tmp_path / "r", hparams=bad)
    assert not (tmp_path / "r").exists()  # refused before anything was written
