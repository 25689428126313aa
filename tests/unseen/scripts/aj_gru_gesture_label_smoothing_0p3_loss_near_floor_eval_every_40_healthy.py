"""A 2-layer GRU classifying noisy pen gestures with label smoothing 0.3 and a held-out
evaluation every 40 steps inside the training loop. The smoothed loss has a floor of 0.965
(not 0), and from step ~200 it moves only ~4 % while held-out accuracy keeps climbing from
0.82 to 0.91. Healthy.

What it does: pen trajectories of 32 (dx, dy, speed) steps, 6 gestures (circle cw / ccw,
zigzag, outward spiral, 'L' stroke, wave) with random rotation, scale, speed warp and heavy
per-step jitter 1.5; fresh batches of 64. Linear+tanh input layer, GRU(32->64, 2 layers,
dropout 0.1), mean over time, dropout 0.2, linear head. Cross-entropy with
label_smoothing=0.3, Adam lr 3e-3, StepLR x0.3 every 200 steps, clip_grad_norm 5. Every
40th step (39, 79, ...) also runs model.eval() on 400 held-out gestures and logs val_acc and
the unsmoothed val loss as metrics; train_acc is logged every step. 480 steps. Standard
preset. Seeded, deterministic.

What is TRUE of the run (measured):
- Healthy. Smoothed-CE floor for 6 classes at 0.3 smoothing: 0.965. Loss medians per 40
  steps: 1.776, 1.416, 1.330, 1.290, 1.270, 1.222, 1.216, 1.204, 1.199, 1.189, 1.195,
  1.169 (a slow crawl toward the floor from step ~200: 1.222 -> 1.169).
- Meanwhile the model keeps getting better: held-out accuracy 0.527, 0.707, 0.767, 0.817,
  0.817, 0.868, 0.875, 0.875, 0.882, 0.880, 0.908, 0.908 at steps 39, 79, ..., 479;
  unsmoothed held-out cross-entropy 1.352 -> 0.739 (step 199) -> 0.602 (step 479);
  training accuracy per 40 steps 0.27 -> 0.81 (200-239) -> 0.87 (440-479).
- Gradient norm (before clipping) 40-step medians 0.22, 1.04, 0.57, 0.71, 0.93, then
  0.43-0.56; max 3.53 (the clip at 5 never bites). No NaN/Inf.
- The evaluation steps take ~2.4-2.6x a normal step (medians 71 vs 27 ms, 98 vs 41 ms in
  two runs), 12 of 480 steps, 5-6 % of the loop time.
- ~20-27 s on 2 busy CPU cores.
"""

import argparse
import math
import time

import torch
from torch import nn
from torch.nn import functional as F
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "forbidden": ["loss_plateau", "step_time_outlier", "vanishing_gradient"],
}

STEPS, BATCH, T, CLASSES, SMOOTH, EVAL_EVERY = 480, 64, 32, 6, 0.3, 40


def gestures(g, n):
    """Pen trajectories as (dx, dy, speed) for T steps, 6 classes: 0 circle clockwise,
    1 circle counter-clockwise, 2 zigzag, 3 spiral outwards, 4 'L' stroke, 5 wave. Random
    rotation, scale, speed profile, and heavy per-step jitter 1.5 (relative to a unit
    stroke step)."""
    y = torch.randint(0, CLASSES, (n,), generator=g)
    s = torch.linspace(0, 1, T + 1)[None].expand(n, -1)
    warp = 0.15 * torch.rand(n, 1, generator=g)
    s = s + warp * torch.sin(math.pi * s)
    s = s / s[:, -1:]
    yc = y[:, None]
    ang = 2 * math.pi * s
    circ_x, circ_y = torch.cos(ang), torch.sin(ang) * torch.where(yc == 0, -1.0, 1.0)
    zig_x, zig_y = (
        2 * s - 1,
        0.5 * torch.sign(torch.sin(4 * ang)) * torch.abs(torch.sin(4 * ang)) ** 0.3,
    )
    spi_x, spi_y = s * torch.cos(1.5 * ang), s * torch.sin(1.5 * ang)
    l_x = torch.where(s < 0.5, torch.zeros_like(s), 2 * (s - 0.5))
    l_y = torch.where(s < 0.5, 1 - 2 * s, torch.zeros_like(s))
    wav_x, wav_y = 2 * s - 1, 0.4 * torch.sin(2 * ang)
    px = torch.where(
        yc <= 1,
        circ_x,
        torch.where(yc == 2, zig_x, torch.where(yc == 3, spi_x, torch.where(yc == 4, l_x, wav_x))),
    )
    py = torch.where(
        yc <= 1,
        circ_y,
        torch.where(yc == 2, zig_y, torch.where(yc == 3, spi_y, torch.where(yc == 4, l_y, wav_y))),
    )
    rot = 2 * math.pi * torch.rand(n, 1, generator=g)
    sc = 0.7 + 0.6 * torch.rand(n, 1, generator=g)
    qx = sc * (px * torch.cos(rot) - py * torch.sin(rot))
    qy = sc * (px * torch.sin(rot) + py * torch.cos(rot))
    dx, dy = qx.diff(dim=1) * T / 4, qy.diff(dim=1) * T / 4
    dx = dx + 1.5 * torch.randn(n, T, generator=g)
    dy = dy + 1.5 * torch.randn(n, T, generator=g)
    sp = torch.sqrt(dx**2 + dy**2)
    return torch.stack([dx, dy, sp], 2), y


class GestureGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(3, 32)
        self.gru = nn.GRU(32, 64, num_layers=2, batch_first=True, dropout=0.1)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(64, CLASSES)

    def forward(self, x):
        out, _ = self.gru(torch.tanh(self.inp(x)))
        return self.head(self.drop(out.mean(1)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    val_x, val_y = gestures(torch.Generator().manual_seed(3), 400)
    model = GestureGRU()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 200, gamma=0.3)
    log, evals, times = [], [], []
    t0 = time.time()
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            ts = time.perf_counter()
            x, y = gestures(g, BATCH)
            out = model(x)
            loss = F.cross_entropy(out, y, label_smoothing=SMOOTH)
            opt.zero_grad()
            loss.backward()
            gn = float(nn.utils.clip_grad_norm_(model.parameters(), 5.0))
            opt.step()
            sched.step()
            acc = (out.argmax(1) == y).float().mean()
            metrics = {"train_acc": acc}
            if step % EVAL_EVERY == EVAL_EVERY - 1:
                model.eval()
                with torch.no_grad():
                    vo = model(val_x)
                model.train()
                vacc = (vo.argmax(1) == val_y).float().mean().item()
                vloss = F.cross_entropy(vo, val_y).item()
                metrics.update(val_acc=vacc, val_loss_unsmoothed=vloss)
                evals.append((step, vacc, vloss))
            rec.step(loss=loss, **metrics)
            log.append((loss.item(), gn, acc.item()))
            times.append(time.perf_counter() - ts)
    for e in evals:
        print(f"eval step {e[0]}: val acc {e[1]:.3f} val CE (unsmoothed) {e[2]:.3f}")

    def med(v):
        return sorted(v)[len(v) // 2]

    for s in range(0, STEPS, 40):
        w = log[s : s + 40]
        print(
            f"{s:3d}-{s + 39}: loss med {med([r[0] for r in w]):.3f} [{min(r[0] for r in w):.3f}, "
            f"{max(r[0] for r in w):.3f}] train acc {sum(r[2] for r in w) / len(w):.3f} gn med "
            f"{med([r[1] for r in w]):.2f} max {max(r[1] for r in w):.2f}"
        )
    ev = [times[i] for i in range(STEPS) if i % EVAL_EVERY == EVAL_EVERY - 1]
    ot = [times[i] for i in range(STEPS) if i % EVAL_EVERY != EVAL_EVERY - 1]
    floor = -(
        (1 - SMOOTH + SMOOTH / CLASSES) * math.log(1 - SMOOTH + SMOOTH / CLASSES)
        + (CLASSES - 1) * SMOOTH / CLASSES * math.log(SMOOTH / CLASSES)
    )
    print(
        f"smoothed-CE floor {floor:.3f}; step time median {med(ot) * 1e3:.1f} ms, eval steps "
        f"median {med(ev) * 1e3:.1f} ms, eval share {sum(ev) / sum(times):.3f}"
    )
    print(f"time {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
