"""An IRNN on row-by-row glyphs, resumed at 250 without gradient clipping: blows up at 251.

What it does: 10-class 20x20 glyph images (six stroke-jittered variants per class, shifted
by up to 2 px, noise 0.1), fed one 20-pixel row per time step to an IRNN (Le, Jaitly &
Hinton 2015: ReLU RNN, 128 units, identity recurrent init, zero biases), read out at the last
row. SGD lr 0.01, momentum 0.9, batch 64, 400 steps. Steps 0-249 clip the gradient norm to
1.0, as IRNN training needs; the job is then preempted and resumed from its checkpoint (same
weights, same optimizer state) by a launcher whose --clip default is 0 ("off"), so steps
250-399 are unclipped. Snapshots around the resume are scored on 1,000 held-out images
after the recorded run. Standard preset. Seeded, deterministic.

What is TRUE of the run (measured):
- Steps 0-249 train normally with clipping active on every step: the raw gradient norm is
  always above 1 (50-step medians 6.8, 15.9, 16.3, 15.1, 16.4; max 44.3 at steps 50-99);
  loss medians 1.973, 1.280, 0.957, 0.759, 0.664; validation accuracy 0.489 (step 49), 0.628,
  0.716, 0.754, 0.789 (step 249).
- Step 250, the first unclipped one, has an ordinary gradient (13.85, loss 0.607), but its
  update is ~14x the clipped size: validation accuracy after it falls to 0.257.
- Step 251: loss 15.41 and gradient norm 301 (7x the largest clipped-phase norm, 18x the
  200-249 median); 252: 9.15 / 153; 253: 8.67 / 161; 254: 2.60 / 10.6. The weights take the
  hit (|W_hh| 11.45 -> 18.7 by step 258 -> 31.0 from step 300); hidden units never active on
  the validation set go from 64% (normal for this IRNN) to 94% at 252 and 97.7% from 299.
- The network never recovers: from step 256 the loss sits near chance (ln 10 = 2.303):
  medians 2.294 (250-299), 2.129, 2.129; validation accuracy 0.11-0.22; gradient norms
  collapse to 0.2-1.7 (medians 0.40, 1.71, 1.23).
- No NaN/Inf. Steps ~8 ms (max 104 ms); ~10 s in all on 2 CPU cores.
"""

import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "gradient_explosion", "first_step": 251, "tolerance": 1},
    ],
}

STEPS, BATCH, SIDE, CLASSES, HIDDEN, RESUME = 400, 64, 20, 10, 128, 250
LR, CLIP = 0.01, 1.0


def make_glyphs(g: torch.Generator, n_variants: int = 6) -> torch.Tensor:
    """Per class, ``n_variants`` hand-drawn-like variants of a 3-stroke glyph (the class's
    stroke endpoints jittered by up to 1.5 px), pixel values in [0, 1]."""
    ys, xs = torch.meshgrid(torch.arange(SIDE).float(), torch.arange(SIDE).float(),
                            indexing="ij")
    base = torch.rand(CLASSES, 3, 2, 2, generator=g) * (SIDE - 8) + 4
    out = torch.zeros(CLASSES, n_variants, SIDE, SIDE)
    for c in range(CLASSES):
        for v in range(n_variants):
            pts = base[c] + (torch.rand(3, 2, 2, generator=g) - 0.5) * 3
            for p, q in pts:
                d = q - p
                t = (((xs - p[0]) * d[0] + (ys - p[1]) * d[1]) / d.pow(2).sum()).clamp(0, 1)
                dist = ((xs - p[0] - t * d[0]) ** 2 + (ys - p[1] - t * d[1]) ** 2).sqrt()
                out[c, v] = torch.maximum(out[c, v], (1.5 - dist).clamp(0, 1))
    return out


def batch(glyphs: torch.Tensor, g: torch.Generator, n: int) -> tuple[torch.Tensor, ...]:
    """Images (n, 20 rows, 20 pixels): a variant of a random class, shifted by up to 2 px,
    noise 0.1, clipped to [0, 1]. Fed to the RNN one row per time step."""
    y = torch.randint(0, CLASSES, (n,), generator=g)
    v = torch.randint(0, glyphs.shape[1], (n,), generator=g)
    img = glyphs[y, v]
    sx, sy = torch.randint(-2, 3, (2, n), generator=g)
    img = torch.stack([torch.roll(im, (int(a), int(b)), (0, 1))
                       for im, a, b in zip(img, sy, sx, strict=True)])
    return (img + 0.1 * torch.randn(n, SIDE, SIDE, generator=g)).clamp(0, 1), y


class IRNN(nn.Module):
    """Le, Jaitly & Hinton (2015): a ReLU RNN with identity recurrent weights and zero
    biases, input weights N(0, 0.001), read out at the last step."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.RNN(SIDE, HIDDEN, nonlinearity="relu", batch_first=True)
        self.head = nn.Linear(HIDDEN, CLASSES)
        nn.init.eye_(self.rnn.weight_hh_l0)
        nn.init.zeros_(self.rnn.bias_hh_l0)
        nn.init.zeros_(self.rnn.bias_ih_l0)
        nn.init.normal_(self.rnn.weight_ih_l0, 0.0, 0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][:, -1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    glyphs = make_glyphs(torch.Generator().manual_seed(3))
    data_g = torch.Generator().manual_seed(1)
    val_x, val_y = batch(glyphs, torch.Generator().manual_seed(7), 1000)

    model = IRNN()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    log, snapshots = [], {}
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            # The job was preempted after step 249 and resumed from its checkpoint by a
            # launcher whose --clip default is 0, meaning "no clipping".
            clip = CLIP if step < RESUME else 0.0
            x, y = batch(glyphs, data_g, BATCH)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            raw = math.sqrt(sum(float(p.grad.double().pow(2).sum())
                                for p in model.parameters()))
            if clip > 0:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            rec.step(loss=loss)
            with torch.no_grad():
                w_hh = model.rnn.weight_hh_l0.norm().item()
            log.append((step, loss.item(), raw, w_hh))
            if step % 50 == 49 or RESUME - 2 <= step <= RESUME + 8:
                snapshots[step] = {k: v.clone() for k, v in model.state_dict().items()}
    probe = IRNN()                                  # evaluated after the recorded run
    for step, state in snapshots.items():
        probe.load_state_dict(state)
        with torch.no_grad():
            h = torch.relu(probe.rnn(val_x)[0][:, -1])
            acc = (probe.head(h).argmax(1) == val_y).float().mean().item()
            dead = (h.amax(0) == 0).float().mean().item()
        _, loss, raw, w_hh = log[step]
        print(f"step {step}: loss {loss:.4f} raw grad norm {raw:.4g} clip "
              f"{CLIP if step < RESUME else 0.0} |W_hh| after {w_hh:.2f} val acc after "
              f"{acc:.3f} hidden units never active {dead:.3f}")
    for s in range(0, STEPS, 50):
        w = log[s:s + 50]
        def med(j: int, w: list = w) -> float:
            return sorted(r[j] for r in w)[len(w) // 2]

        print(f"steps {s:3d}-{s + 49:3d}: loss median {med(1):.3f} [{min(r[1] for r in w):.3f},"
              f" {max(r[1] for r in w):.3f}]  raw grad norm median {med(2):.3f} "
              f"[{min(r[2] for r in w):.3f}, {max(r[2] for r in w):.3f}]")


if __name__ == "__main__":
    main()
