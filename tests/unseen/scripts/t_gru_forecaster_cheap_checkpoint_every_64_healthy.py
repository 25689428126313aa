"""GRU multi-step forecaster that writes a small checkpoint to local disk every 64 steps, inside
the step loop (before ``rec.step()``). The checkpoint is cheap: it adds a few milliseconds to
those steps. HEALTHY.

What it does: 6 synthetic sensor channels, each a sum of two sinusoids (periods 12-60
samples, random phase per window) plus AR(1) noise (phi 0.7, innovation std 0.15); a fixed
random 6x6 mixing couples the channels. 20,000 windows of 48 past samples -> the next 8
samples of all channels are pre-generated and served by a shuffled DataLoader (batch 32)
wrapped with ``rec.wrap_loader``. Model: GRU(6 -> 64, 2 layers) -> last hidden state ->
Linear(64, 48) reshaped to 8 x 6; MSE. Adam(2e-3), 384 steps. After the optimizer step of
every 64th step (steps 63, 127, 191, 255, 319, 383) the loop saves {model, optimizer, step}
with ``torch.save`` to a temporary directory on local disk (written to a ``.tmp`` name, then
``os.replace``; the two newest kept), 0.49 MB each.

What is TRUE of the run (measured twice on the shared 2-core machine, 22-32 s wall; figures
from the recorded ``steps`` table of the judged run, the second run in brackets):
- Step time (steps 2-383): median 36 ms, p10 26, p90 67, p99 104 ms [non-checkpoint median
  58 ms, p90 75]. Step 1 265 ms (warm-up) and step 52 221 ms (the recorder's own profiler
  window, ``standard`` preset) are the slowest; the next four (262, 251, 311, 374: 102-123
  ms, the only steps > 3x the median) each had 62-81 ms of run-queue wait (``cpu_queue_s``:
  other processes on the 2 shared cores), not work of the script.
- The checkpoint itself takes 2.6-10.4 ms [script's own timer]; the checkpoint steps 63, 127,
  191, 255, 319, 383 took 37, 29, 71, 30, 89, 34 ms with 29-34 ms of CPU each, i.e. an
  ordinary step (the 71 and 89 ms are run-queue wait again). The checkpoint is invisible in
  the step time; nothing about the run is periodic.
- Data wait ~0 (0.18 s in all, max 8.8 ms).
- Loss (MSE, 50-step means) 1.29, 0.79, 0.64, 0.52, 0.44, 0.36, 0.33, 0.32; finite.
- RSS 454 -> 470 MB: 460 by step ~60, flat 460.3-460.4 to step 245, +10 MB at ~250, flat
  470.1 to the end.
- Nothing is wrong: a healthy run with a cheap periodic checkpoint.
"""

import argparse
import math
import os
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, CH, PAST, AHEAD, CKPT_EVERY = 384, 32, 6, 48, 8, 64


def make_windows(n, gen):
    t = torch.arange(PAST + AHEAD, dtype=torch.float32)
    periods = 12 + 48 * torch.rand(2, CH, generator=gen)
    amps = 0.5 + torch.rand(2, CH, generator=gen)
    phase = 2 * math.pi * torch.rand(n, 2, CH, 1, generator=gen)
    clean = (amps[None, :, :, None]
             * torch.sin(2 * math.pi * t / periods[None, :, :, None] + phase)).sum(1)
    eps = 0.15 * torch.randn(n, CH, PAST + AHEAD, generator=gen)
    noise = torch.zeros_like(eps)
    noise[..., 0] = eps[..., 0]
    for i in range(1, PAST + AHEAD):
        noise[..., i] = 0.7 * noise[..., i - 1] + eps[..., i]
    mix = torch.eye(CH) + 0.2 * torch.randn(CH, CH, generator=gen)
    series = torch.einsum("ij,njt->nit", mix, clean + noise).transpose(1, 2)
    return series[:, :PAST].contiguous(), series[:, PAST:].contiguous()


class Forecaster(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(CH, 64, num_layers=2, batch_first=True)
        self.head = nn.Linear(64, AHEAD * CH)

    def forward(self, x):
        _, h = self.gru(x)
        return self.head(h[-1]).view(-1, AHEAD, CH)


def pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(64)
    x, y = make_windows(20000, gen)
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(2))
    model = Forecaster()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    losses, durs, ckpt = [], [], {}
    with tempfile.TemporaryDirectory() as ckdir, \
            Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        last = time.perf_counter()
        for step, (xb, yb) in enumerate(rec.wrap_loader(loader)):
            if step == STEPS:
                break
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if (step + 1) % CKPT_EVERY == 0:
                t0 = time.perf_counter()
                path = os.path.join(ckdir, f"ckpt-{step:06d}.pt")
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                            "step": step}, path + ".tmp")
                os.replace(path + ".tmp", path)
                for old in sorted(os.listdir(ckdir))[:-2]:
                    os.remove(os.path.join(ckdir, old))
                ckpt[step] = (time.perf_counter() - t0, os.path.getsize(path))
            rec.step(loss=loss)
            now = time.perf_counter()
            durs.append(now - last)
            last = now
            losses.append(loss.item())
    plain = [t for i, t in enumerate(durs) if i not in ckpt and i > 1]
    print(f"non-checkpoint steps: median {pct(plain, 0.5) * 1e3:.1f} ms, p90 "
          f"{pct(plain, 0.9) * 1e3:.1f}, max {max(plain) * 1e3:.1f} at "
          f"{durs.index(max(plain))}; total {sum(durs):.1f} s")
    print("checkpoint steps (step, save ms, step ms, MB):",
          [(s, round(c * 1e3, 1), round(durs[s] * 1e3, 1), round(b / 2 ** 20, 2))
           for s, (c, b) in ckpt.items()])
    top = sorted(range(len(durs)), key=lambda i: -durs[i])[:8]
    print("slowest steps", [(i, round(durs[i] * 1e3, 1)) for i in top])
    w = 48
    print("loss window means", [round(sum(losses[i:i + w]) / w, 4)
                                for i in range(0, len(losses), w)])


if __name__ == "__main__":
    main()
