"""Shared LSTM encoder trained round-robin on three tasks with very different loss scales:
regression (MSE), classification (cross-entropy) and contrastive (InfoNCE), one task per step.

What it does: fresh batches of 32 noisy sequences (20 steps x 8 features) each step; one of
6 random 5-step motifs is pasted at a random place. A 2-layer LSTM (hidden 64) encodes the
sequence (last hidden state) and three heads read it. Step % 3 == 0: regression of a
cumulative linear readout of the sequence (MSE, target sd 3.9, noise sd 0.6); step % 3 ==
1: which motif (6-way cross-entropy); step % 3 == 2: contrastive InfoNCE between two
augmented views (jitter, feature dropout, time shift), temperature 0.2, batch 32 (chance
ln 32 = 3.47). One Adam (lr 2e-3, no clipping) over everything, 600 optimizer steps, one
rec.step per optimizer step; the metric "task" is 0/1/2.

What is TRUE of the run (measured; medians per task over 60-step windows):
- Every task learns: regression MSE 8.7 (steps 0-59) -> 2.3 (60-119) -> ~0.85-1.0 from
  step ~180 on (its floor region; per-step 0.45-2.8); classification 1.76 -> 1.58 (60-179)
  -> 1.31 (300-359) -> 0.55 (540-599); contrastive 3.25 -> 3.01 (120-179) -> 2.46
  (300-359) -> 1.90 (540-599).
- The recorded loss is a 3-step saw-tooth by design: early the regression steps are the
  high ones (up to 19 at step 0-59, vs ~1.8 and ~3.3), late the contrastive steps are
  (~1.9 vs ~1.0 and ~0.55). The grad norm is 4-15x larger on regression steps throughout
  (median 8-17 vs 0.7-1.2 for classification and 1.4-3.8 for contrastive). Both patterns
  are the schedule of the multi-task loop, not spikes, explosions or divergence.
- No NaN/Inf, nothing wrong with memory, data or step times. Healthy: nothing above info.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True,
          "forbidden": ["loss_spike", "loss_divergence", "gradient_explosion", "loss_plateau"]}

T, FEAT, HID, PATTERNS = 20, 8, 64, 6
BATCH, STEPS, LR = 32, 600, 2e-3
TASKS = ("regress", "classify", "contrast")


def make_source(seed):
    g = torch.Generator().manual_seed(seed)
    motifs = torch.randn(PATTERNS, 5, FEAT, generator=g)
    w_reg = torch.randn(FEAT, generator=g)
    return g, motifs, w_reg


def sample(g, motifs, w_reg, n):
    """Noisy sequences with one of PATTERNS motifs pasted at a random place; the regression
    target is a large-scale cumulative readout of the sequence."""
    x = torch.randn(n, T, FEAT, generator=g)
    y_cls = torch.randint(0, PATTERNS, (n,), generator=g)
    start = torch.randint(0, T - 5, (n,), generator=g)
    for i in range(n):
        s = int(start[i])
        x[i, s:s + 5] += 2.0 * motifs[y_cls[i]]
    drift = torch.cumsum(x @ w_reg, 1)[:, -1] / T ** 0.5             # ~N(0, |w|^2)
    y_reg = 1.2 * drift + 0.6 * torch.randn(n, generator=g)
    return x, y_cls, y_reg


def augment(x, g):
    """A view for the contrastive task: jitter, feature dropout, small time shift."""
    v = x + 0.5 * torch.randn(x.shape, generator=g)
    v = v * (torch.rand(x.shape[0], 1, FEAT, generator=g) > 0.15).float()
    return torch.roll(v, int(torch.randint(-2, 3, (1,), generator=g)), dims=1)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(FEAT, HID, num_layers=2, batch_first=True)
        self.reg = nn.Sequential(nn.Linear(HID, 64), nn.Tanh(), nn.Linear(64, 1))
        self.cls = nn.Linear(HID, PATTERNS)
        self.proj = nn.Sequential(nn.Linear(HID, 64), nn.ReLU(), nn.Linear(64, 32))

    def forward(self, x):
        out, _ = self.lstm(x)
        return out[:, -1]


def task_loss(model, task, g, motifs, w_reg):
    x, y_cls, y_reg = sample(g, motifs, w_reg, BATCH)
    if task == "regress":
        return F.mse_loss(model.reg(model(x)).squeeze(-1), y_reg)
    if task == "classify":
        return F.cross_entropy(model.cls(model(x)), y_cls)
    z1 = F.normalize(model.proj(model(augment(x, g))), dim=-1)
    z2 = F.normalize(model.proj(model(augment(x, g))), dim=-1)
    logits = z1 @ z2.T / 0.2
    labels = torch.arange(BATCH)
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g, motifs, w_reg = make_source(1)
    model = Encoder()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            task = TASKS[step % 3]
            loss = task_loss(model, task, g, motifs, w_reg)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss, task=float(step % 3))
            if step % 60 < 3:
                print(f"step {step} {task} {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
