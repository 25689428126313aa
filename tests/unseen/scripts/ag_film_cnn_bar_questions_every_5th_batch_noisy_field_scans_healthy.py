"""FiLM-conditioned CNN answering questions about bar images; every 5th batch is noisy field data.

What it does: 16x16 single-channel images, each with one bright bar (horizontal or
vertical, random row/column, 1 or 2 pixels wide), and one of 4 yes/no questions (is it
vertical? is it in the first half? is it thick? is its position even?). Model: the question
id is embedded and a linear layer produces FiLM scale/shift (Perez et al.) for two conv
blocks (conv 3x3 -> BatchNorm without affine -> gamma * h + beta -> ReLU, 24 channels, a
max-pool between), max+mean pooling, a 2-layer MLP head; BCE. AdamW lr 2e-3, wd 1e-4,
constant, batch 32, 300 steps, data generated fresh each step. By design the loop
alternates two sources: steps 4, 9, 14, ... (every 5th, step % 5 == 4) train on a batch of
"field scans" (pixel noise sd 1.2 instead of 0.1, and 25% of the answers wrong), the other
four of five on clean "lab" renders. Both are real training steps. Standard preset,
profiler off.

What is TRUE of the run (measured, 50-step windows, lab / field steps separately):
- Lab batches learn steadily: median loss 0.523 (steps 0-49), 0.259, 0.180, 0.156, 0.132,
  0.117 (steps 250-299). Field batches stay at 0.70-0.80 (medians 0.730, 0.742, 0.737,
  0.801, 0.771, 0.704; max 0.943), near their floor: with 25% wrong answers no model can
  go below H(0.25) = 0.56 nats, and the noise hides thin bars.
- So the loss curve is a saw-tooth with period 5: from step 54 on, every field step's
  loss is 2.2-8.4x the median of the four lab steps before it (median ratio ~4) and above
  all four of them (by 1.9x at least), by construction. Gradient norms follow the same
  pattern: lab steps 0.63-0.90 (window medians), field steps 1.3-3.9; neither grows over
  the run. No NaN/Inf. ~8 s on 2 CPU cores (steps ~8-10 ms).
- Healthy: the periodic loss and gradient jumps are a known, scheduled mix of two data
  sources, not spikes, divergence or an explosion; the overall trend is down.
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
    "forbidden": ["loss_spike", "loss_divergence", "gradient_explosion", "loss_plateau",
                  "step_time_outlier", "nonfinite"],
}

SIZE, QUESTIONS, BATCH, STEPS, EVERY = 16, 4, 32, 300, 5


def bar_images(n: int, g: torch.Generator, noise: float, flip: float):
    """One bright bar per image (horizontal or vertical, random row/column, width 1 or 2) and
    a question id; the answer is a yes/no property of the bar."""
    vertical = torch.rand(n, generator=g) < 0.5
    pos = torch.randint(0, SIZE - 2, (n,), generator=g)
    thick = torch.rand(n, generator=g) < 0.5
    img = torch.zeros(n, 1, SIZE, SIZE)
    ar = torch.arange(SIZE)
    on = (ar[None] >= pos[:, None]) & (ar[None] < (pos + 1 + thick.long())[:, None])
    rows = on[:, None, :, None].expand(n, 1, SIZE, SIZE)
    cols = on[:, None, None, :].expand(n, 1, SIZE, SIZE)
    img = torch.where(vertical[:, None, None, None], cols, rows).float()
    img = img + noise * torch.randn(n, 1, SIZE, SIZE, generator=g)
    q = torch.randint(0, QUESTIONS, (n,), generator=g)
    answers = torch.stack([vertical, pos < SIZE // 2 - 1, thick, pos % 2 == 0], 1)
    y = answers[torch.arange(n), q].float()
    flipped = torch.rand(n, generator=g) < flip
    y = torch.where(flipped, 1 - y, y)
    return img, q, y


class FiLMBlock(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm = nn.BatchNorm2d(cout, affine=False)

    def forward(self, x, gamma, beta):
        h = self.norm(self.conv(x))
        return torch.relu(gamma[:, :, None, None] * h + beta[:, :, None, None])


class FiLMNet(nn.Module):
    def __init__(self, width: int = 24) -> None:
        super().__init__()
        self.question = nn.Embedding(QUESTIONS, 32)
        self.film = nn.Linear(32, 4 * width)
        self.block1 = FiLMBlock(1, width)
        self.block2 = FiLMBlock(width, width)
        self.head = nn.Sequential(nn.Linear(width * 2, 32), nn.ReLU(), nn.Linear(32, 1))
        self.width = width

    def forward(self, img, q):
        g1, b1, g2, b2 = self.film(self.question(q)).split(self.width, dim=1)
        h = self.block1(img, 1 + g1, b1)
        h = self.block2(nn.functional.max_pool2d(h, 2), 1 + g2, b2)
        pooled = torch.cat([h.amax((2, 3)), h.mean((2, 3))], 1)
        return self.head(pooled).squeeze(1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)

    model = FiLMNet()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    lab, field = [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0) as rec:
        for step in range(STEPS):
            is_field = step % EVERY == EVERY - 1
            if is_field:
                img, q, y = bar_images(BATCH, g, noise=1.2, flip=0.25)
            else:
                img, q, y = bar_images(BATCH, g, noise=0.1, flip=0.0)
            loss = nn.functional.binary_cross_entropy_with_logits(model(img, q), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss, field_batch=float(is_field))
            (field if is_field else lab).append((step, loss.item()))

    def med(rows, a, b):
        v = sorted(x for s, x in rows if a <= s < b)
        return v[len(v) // 2]

    for a in range(0, STEPS, 50):
        print(f"steps {a:3d}-{a + 49:3d}: median loss lab {med(lab, a, a + 50):.3f}  "
              f"field {med(field, a, a + 50):.3f}")


if __name__ == "__main__":
    main()
