"""CUDA training as users run it: the debug preset's backward NaN origin on the GPU, model
FLOPs and MFU against the device's peak, fp16 AMP whose GradScaler skips overflowing steps
(normal, so never a warning), and a torch.compile'd model. Skipped without CUDA."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import torch
import torch.nn.functional as F
from rec_helpers import FAST
from torch import nn
from tracealyze.recorder import Recorder
from tracealyze.recorder.training.throughput import peak_for

from tests.matrix.models import SEQ, VOCAB, NanoGPT, nanogpt_loss
from tests.recorder.test_backward_nan import BAD_FROM, Block, SqrtGate, _run, _tokens
from tests.recorder.test_throughput import _reference_flops

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
CLI = [sys.executable, "-c", "from tracealyze.analyzer.cli import main; main()"]


def _steps(run: Path) -> list[dict]:
    rows = ds.dataset(run / "steps", partitioning="hive").to_table().to_pylist()
    return sorted(rows, key=lambda r: r["step"])


def _summary(run: Path) -> dict:
    out = subprocess.run([*CLI, "summary", str(run), "--json"], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def test_backward_made_nan_names_its_module_on_cuda(tmp_path: Path) -> None:
    def batch(step: int) -> tuple[torch.Tensor, ...]:
        return tuple(t.cuda() for t in _tokens(step))

    f = _run(tmp_path / "run", Block(SqrtGate()).cuda(), batch)
    assert f["evidence"].get("direction") == "backward", f
    assert f["subject"] == "bad" and f["first_step"] == BAD_FROM, f


def test_flops_and_mfu_against_the_device_peak(tmp_path: Path) -> None:
    model = NanoGPT(seed=0)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, VOCAB, (8, SEQ), generator=g) for _ in range(12)]
    model = model.cuda()
    # FlopCounterMode around a step of a copy on the same device (CUDA's attention kernels
    # are counted as such)
    want = _reference_flops(model, nanogpt_loss, batches[0].cuda())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    with Recorder(tmp_path / "run", model=model, optimizer=opt, **FAST) as rec:
        for b in rec.wrap_loader([b.cuda() for b in batches]):
            loss = nanogpt_loss(model, b)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    rows = _steps(tmp_path / "run")
    counted = [r for r in rows if r["flops"] is not None]
    assert len(counted) == len(rows) - 1
    assert all(r["flops"] == want for r in counted)
    peak = peak_for(torch.cuda.get_device_name(), "fp32")
    for r in counted:
        assert r["tokens_per_s"] == pytest.approx(8 * SEQ / r["duration_s"])
        if peak is None:  # a device outside the peak table: no MFU rather than a guess
            assert r["mfu"] is None
        else:
            assert 0 < r["mfu"] < 1 and r["mfu"] == pytest.approx(
                r["flops"] / r["duration_s"] / peak, rel=1e-6)


def test_fp16_grad_scaler_overflow_skips_are_not_a_warning(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 8)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    # a large first scale overflows the fp16 gradients: the scaler skips and halves until
    # it fits, the way every fp16 run starts
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 40)
    g = torch.Generator(device="cuda").manual_seed(0)
    with Recorder(tmp_path / "run", model=model, optimizer=opt, scaler=scaler, **FAST) as rec:
        for _ in range(80):
            x = torch.randn(32, 64, device="cuda", generator=g)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = F.mse_loss(model(x), x[:, :8])
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            rec.step(loss=loss)
        assert rec.errors == 0
    rows = _steps(tmp_path / "run")
    skipped = [r["step"] for r in rows if r["amp_skipped"]]
    assert skipped and skipped[0] == 0 and len(skipped) < 40, skipped
    assert all(r["loss"] is not None for r in rows)
    findings = _summary(tmp_path / "run")["findings"]
    loud = [f for f in findings if f["severity"] in ("warning", "error", "critical")]
    assert not loud, loud
    assert any(f["id"] == "nonfinite" and f["severity"] == "info" for f in findings)


def test_a_compiled_model_records_every_step(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = NanoGPT(seed=0).cuda()
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, VOCAB, (8, SEQ), generator=g).cuda() for _ in range(4)]
    with Recorder(tmp_path / "run", model=model, optimizer=opt, **FAST) as rec:
        for i in range(30):
            loss = nanogpt_loss(compiled, batches[i % 4])
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
        assert rec.errors == 0
    rows = _steps(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(30))
    assert all(r["loss"] is not None and r["grad_norm"] > 0 for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"]
    events = ds.dataset(tmp_path / "run" / "events", partitioning="hive").to_table()
    assert "recorder_error" not in events.column("kind").to_pylist()


def test_the_anomaly_window_on_cuda(tmp_path: Path) -> None:
    from tests.recorder.test_anomaly_window import EVERY, Net, _batch

    torch.manual_seed(0)
    m = Net().cuda()
    with torch.no_grad():
        m.a.bias.zero_()
    m.a.bias.requires_grad_(False)
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.01)
    with Recorder(tmp_path / "run", model=m, optimizer=opt, preset="debug",
                  flush_interval_s=0.2, profile_start=0, system_interval_s=0) as rec:
        for step in range(4 * EVERY):
            loss = m(_batch(step).cuda()).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            for p in m.parameters():  # (the loop's own guard: NaN gradients zeroed)
                if p.grad is not None:
                    torch.nan_to_num_(p.grad, nan=0.0, posinf=0.0, neginf=0.0)
            opt.step()
            rec.step(loss=loss)
            torch.cuda.synchronize()
            time.sleep(0.02)  # (steps long enough for the writer to see each NaN in time)
        assert rec.errors == 0
    t = ds.dataset(tmp_path / "run" / "events", partitioning="hive").to_table().to_pylist()
    caught = [json.loads(e["details"]) for e in t if e["kind"] == "anomaly"]
    assert caught and all("test_anomaly_window.py" in (d["user_frame"] or "") for d in caught)
    (f,) = [f for f in _summary(tmp_path / "run")["findings"] if f["id"] == "nonfinite"]
    assert f["evidence"]["anomaly"]["user_frame"].startswith(
        str(Path(__file__).parent / "test_anomaly_window.py"))
