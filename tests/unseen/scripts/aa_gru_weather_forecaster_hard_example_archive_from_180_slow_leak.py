"""2-layer GRU forecasting the next 24 hours of temperature from 120 hours of 5-channel station
weather. From step 180 a debug "hard example archive" is switched on. Every step it keeps
copies of the 10 worst input windows of the batch (10 x 120 x 5 float32 = 23.4 KiB) plus
their losses, in a list that is never read or trimmed. A slow LEAK of ~24 KiB/step of heap
from step 180 (7.3 MiB by the end), invisible in RSS: malloc reuses free arena space left
from earlier steps.

What it does: two years of hourly synthetic weather (temperature with daily and yearly cycles
and AR(1) weather, humidity, pressure, wind, cloud cover; standardised). Windows are drawn from
the first 80%. Model: GRU(5->48, 2 layers, dropout 0.1) -> MLP 48->64->24, added to the last
observed temperature. MSE loss, clip_grad_norm 1.0, Adam(2e-3), batch 48, 500 steps.

What is TRUE of the run (measured, 2 runs, identical losses; heap = glibc mallinfo2 uordblks +
hblkhd, RSS from psutil, right after rec.step):
- Steps 0-179: heap 128.6-128.8 MiB at step 0. There is a one-off bump to 135.1-135.2 around
  step 50 (the recorder's default profiler window), back to 130.2-130.3 by step 100. Then
  130.2-130.6 over 100-179 (+0.0035 MiB/step).
- From step 180: heap 130.45-130.57 at 180, 131.0-131.1 at 200, 132.2 at 250, 133.3-133.5 at
  300, 135.8-135.9 at 400, 138.0-138.2 at 499. Slopes +24.1 to +24.5 KiB/step over 180-279,
  280-499 and 180-499 (linear), 7.3-7.6 MiB in all (320 entries x 23.5 KiB of tensor data).
- RSS shows none of it: 416 at step 0, 489 at 100, 498.8 at 150-179, then 499.2 down to 496.6
  over 180-499 (-10 KiB/step).
- Training is healthy and unaffected: loss 50-step means 0.346, 0.125, 0.097, 0.100, 0.099,
  0.093, 0.094, 0.096, 0.096, 0.094; held-out MSE 0.100 against 0.542 for persistence. Finite.
- Root cause: a memory leak starting at step 180.
- About 36-41 s of training (40-46 s wall) on 2 shared cores, 1 thread.
"""

import argparse
import ctypes
import math
import time

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "memory_leak", "first_step": 180, "tolerance": 25}],
          "forbidden": ["loss_divergence", "gradient_explosion", "nonfinite"]}

STEPS, BATCH, HIST, HORIZON, CH, HID = 500, 48, 120, 24, 5, 48
ARCHIVE_FROM, ARCHIVE_K = 180, 10

class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo2():
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


_MI = _mallinfo2()
_PROC = psutil.Process()


def memory_mib():
    """(RSS, heap) in MiB; heap = glibc mallinfo2 uordblks + hblkhd."""
    heap = float("nan")
    if _MI is not None:
        mi = _MI()
        heap = (mi.uordblks + mi.hblkhd) / 2 ** 20
    return _PROC.memory_info().rss / 2 ** 20, heap


def slope(trace, a, b, i):
    part = trace[a:b + 1]
    xm = (len(part) - 1) / 2
    return (sum((x - xm) * p[i] for x, p in enumerate(part))
            / sum((x - xm) ** 2 for x in range(len(part))))


def make_series(g, hours=24 * 365 * 2):
    """Two years of hourly synthetic weather at one station: temperature (daily + yearly
    cycle + AR(1) weather), humidity (anti-correlated with temperature), pressure (slow AR),
    wind speed (gamma-ish bursts), cloud cover; standardised per channel."""
    t = torch.arange(hours, dtype=torch.float32)
    day = torch.sin(2 * math.pi * (t % 24) / 24 - 2.0)
    year = torch.sin(2 * math.pi * t / (24 * 365.25) - 1.8)
    eps = torch.randn(hours, 3, generator=g)
    ar = torch.zeros(hours, 3)
    for k in range(1, hours):
        ar[k] = torch.tensor([0.98, 0.995, 0.9]) * ar[k - 1] + eps[k] * torch.tensor(
            [0.3, 0.2, 0.5])
    temp = 10 + 9 * year + 5 * day * (1 + 0.3 * year) + 2.5 * ar[:, 0]
    hum = 70 - 1.5 * (temp - 10) + 4 * ar[:, 2] + 3 * torch.randn(hours, generator=g)
    press = 1013 + 6 * ar[:, 1]
    wind = F.softplus(2 * ar[:, 2] + torch.randn(hours, generator=g))
    cloud = torch.sigmoid(ar[:, 2] - 0.1 * (press - 1013))
    x = torch.stack([temp, hum, press, wind, cloud], -1)
    return (x - x.mean(0)) / x.std(0)


class GRUForecaster(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(CH, HID, num_layers=2, batch_first=True, dropout=0.1)
        self.head = nn.Sequential(nn.Linear(HID, 64), nn.ReLU(), nn.Linear(64, HORIZON))

    def forward(self, x):
        out, _ = self.gru(x)
        return x[:, -1:, 0] + self.head(out[:, -1])        # residual on the last temperature


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(17)
    series = make_series(g)
    n_train = int(len(series) * 0.8)
    model = GRUForecaster()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    hard_examples = []           # "to look at later": the K worst windows of each step
    trace = []
    t0 = time.time()
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            start = torch.randint(0, n_train - HIST - HORIZON, (BATCH,), generator=g)
            idx = start[:, None] + torch.arange(HIST + HORIZON)
            win = series[idx]                                   # (B, HIST + HORIZON, CH)
            x, y = win[:, :HIST], win[:, HIST:, 0]
            pred = model(x)
            per_sample = F.mse_loss(pred, y, reduction="none").mean(1)
            loss = per_sample.mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step >= ARCHIVE_FROM:     # debug archive switched on after the first phase
                worst = per_sample.detach().topk(ARCHIVE_K).indices
                hard_examples.append({"step": step, "x": x[worst].clone(),
                                      "loss": per_sample[worst].detach().clone()})
            rec.step(loss=loss)
            rss, heap = memory_mib()
            trace.append((step, loss.item(), rss, heap, len(hard_examples)))
            if step % 25 == 0 or ARCHIVE_FROM - 1 <= step <= ARCHIVE_FROM + 1:
                print(f"step {step} loss {loss.item():.4f} rss {rss:.1f} heap {heap:.1f} "
                      f"archived {len(hard_examples)}", flush=True)
    print(f"[time] {time.time() - t0:.1f} s")
    with torch.no_grad():
        model.eval()
        s = torch.arange(n_train, len(series) - HIST - HORIZON, 97)
        w = series[s[:, None] + torch.arange(HIST + HORIZON)]
        val = F.mse_loss(model(w[:, :HIST]), w[:, HIST:, 0]).item()
        persist = F.mse_loss(w[:, HIST - 1:HIST, 0].expand(-1, HORIZON), w[:, HIST:, 0]).item()
    print(f"[fit] held-out MSE {val:.4f} (persistence baseline {persist:.4f})")
    e = hard_examples[0]
    per = sum(v.numel() * v.element_size() for v in e.values() if torch.is_tensor(v)) / 1024
    print(f"[archive] {len(hard_examples)} entries of {per:.2f} KiB tensor data, "
          f"{per * len(hard_examples) / 1024:.2f} MiB")
    for a, b in ((0, 99), (60, 179), (100, 179), (180, 279), (280, 499), (180, 499)):
        print(f"[slope] steps {a}-{b}: rss {slope(trace, a, b, 2) * 1024:+.2f} KiB/step, heap "
              f"{slope(trace, a, b, 3) * 1024:+.2f} KiB/step")
    for s in (0, 25, 50, 100, 150, 178, 179, 180, 181, 200, 250, 300, 350, 400, 450, 499):
        t = trace[s]
        print(f"[mem] step {s}: rss {t[2]:.1f} heap {t[3]:.2f} archived {t[4]}")
    for a in range(0, STEPS, 50):
        part = trace[a:a + 50]
        n = len(part)
        print(f"[win] steps {a}-{a + n - 1}: loss {sum(p[1] for p in part) / n:.4f} rss "
              f"{min(p[2] for p in part):.1f}-{max(p[2] for p in part):.1f} heap "
              f"{min(p[3] for p in part):.2f}-{max(p[3] for p in part):.2f}")


if __name__ == "__main__":
    main()
