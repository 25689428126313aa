"""A 20-block SkipInit residual MLP on tabular data, resumed at step 200 with code whose
blocks lost their skip connection: gradients to the early blocks vanish from step 200.

What it does: forest-cover-like tabular rows (10 numeric features, 40 one-hot soil types, 4
one-hot areas) labelled into 7 classes by a random tanh teacher network with sampling noise;
fresh batches of 128. A 20-block residual MLP with SkipInit (De & Smith 2020: each block is
x + alpha * fc2(relu(fc1(x))), width 128, alpha a learned scalar started at 0, no
normalisation layers), stem and head linear layers. Adam lr 1e-3, 400 steps. The job is
preempted after step 199 and resumed at 200 from its checkpoint (weights and Adam state
intact) on refactored model code in which the residual add moved into a wrapper the training
builder does not use: from step 200 every block computes only alpha * fc2(relu(fc1(x))).
Standard preset. Seeded, deterministic.

What is TRUE of the run (measured):
- Steps 0-199 train normally: loss medians per 50 steps 1.566, 0.750, 0.641, 0.570;
  held-out accuracy (2,000 rows) 0.685, 0.744, 0.777, 0.784; total gradient norm medians
  1.03, 1.24, 1.26, 1.27. The learned alphas are small, |alpha| 0.042-0.055 in every block.
- At step 200, without the skips, each of the 20 blocks scales the signal down by its small
  alpha, and the gradient on its way back with it: the gradient norm of stem.weight goes
  from 0.54 (step 199; median 0.69 over 150-199) to 2.0e-23 (step 200), blocks.0.fc1.weight
  from 0.031 to 1.6e-23, blocks.9.fc1.weight from 0.018 to 4e-15, blocks.19.fc1.weight from
  0.021 to 1.5e-3; head.weight from 0.52 to 0.023. Medians over 200-399 stay at that level
  (stem.weight 1e-22 to 5e-22, blocks.0.fc1.weight 7e-23 to 3e-22): 86 of the 104
  parameters have a gradient-norm median below 1/1000 of their 150-199 median.
- The loss jumps from 0.515 (step 199) to 1.929 (step 200) and stays near chance (ln 7 =
  1.946): medians 1.913, 1.847, 1.824, 1.835 (steps 200-399); held-out accuracy 0.20-0.24.
  Only the head and the last few blocks still get usable gradients.
- Total gradient norm medians 0.21, 0.32, 0.22, 0.24 (200-399): the total hides how deep
  the vanishing goes. No NaN/Inf.
- ~10 s on 2 busy CPU cores.
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
        {"id": "vanishing_gradient", "first_step": 200, "tolerance": 2},
    ],
    "forbidden": ["gradient_explosion", "nonfinite"],
}

STEPS, RESUME, BATCH, FEATURES, CLASSES, WIDTH, BLOCKS = 400, 200, 128, 54, 7, 128, 20
LR = 1e-3


def make_teacher(g: torch.Generator) -> list[torch.Tensor]:
    """A random 2-layer tanh network that labels the data (forest-cover-like: 10 numeric
    features and 44 one-hot soil/area indicators)."""
    return [torch.randn(FEATURES, 64, generator=g) / math.sqrt(FEATURES) * 2,
            torch.randn(64, CLASSES, generator=g)]


def rows(teacher: list[torch.Tensor], g: torch.Generator, n: int):
    num = torch.randn(n, 10, generator=g)
    soil = F.one_hot(torch.randint(0, 40, (n,), generator=g), 40).float()
    area = F.one_hot(torch.randint(0, 4, (n,), generator=g), 4).float()
    x = torch.cat([num, soil, area], 1)
    logits = torch.tanh(x @ teacher[0]) @ teacher[1]
    y = torch.distributions.Categorical(logits=logits * 1.5).sample()  # (uses global RNG)
    return x, y


class SkipInitBlock(nn.Module):
    """De & Smith (2020) SkipInit: x + alpha * MLP(x), alpha a learned scalar started at 0,
    no normalisation layers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, WIDTH)
        self.fc2 = nn.Linear(WIDTH, WIDTH)
        self.alpha = nn.Parameter(torch.zeros(()))
        self.skip = True      # the checkpointed training code

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch = self.alpha * self.fc2(F.relu(self.fc1(x)))
        return x + branch if self.skip else branch


class ResMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.Sequential(*(SkipInitBlock() for _ in range(BLOCKS)))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.blocks(self.stem(x))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    teacher = make_teacher(torch.Generator().manual_seed(3))
    data_g = torch.Generator().manual_seed(1)
    val_x, val_y = rows(teacher, torch.Generator().manual_seed(9), 2000)

    model = ResMLP()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    names = [n for n, _ in model.named_parameters()]
    watch = ["stem.weight", "blocks.0.fc1.weight", "blocks.9.fc1.weight",
             "blocks.19.fc1.weight", "head.weight"]
    log = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            if step == RESUME:
                # Preempted after step 199; the job restarts from its checkpoint (weights and
                # Adam state intact) on the refactored model code, in which the residual add
                # moved into a wrapper that the training builder does not use.
                for b in model.blocks:
                    b.skip = False
                alphas = [round(b.alpha.item(), 3) for b in model.blocks]
                print(f"learned alphas at the resume: {alphas}")
            x, y = rows(teacher, data_g, BATCH)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            gn = {n: float(p.grad.double().norm()) for n, p in model.named_parameters()}
            raw = math.sqrt(sum(v * v for v in gn.values()))
            opt.step()
            rec.step(loss=loss)
            log.append((step, loss.item(), raw, gn))
            if step % 50 == 49 or step in (RESUME - 1, RESUME):
                with torch.no_grad():
                    acc = (model(val_x).argmax(1) == val_y).float().mean().item()
                print(f"step {step}: val acc after the step {acc:.3f}")

    def med(v: list) -> float:
        return sorted(v)[len(v) // 2]

    for s in range(0, STEPS, 50):
        w = log[s:s + 50]
        print(f"steps {s:3d}-{s + 49:3d}: loss median {med([r[1] for r in w]):.3f} "
              f"[{min(r[1] for r in w):.3f}, {max(r[1] for r in w):.3f}]  grad norm median "
              f"{med([r[2] for r in w]):.4g}")
        print("    " + ", ".join(f"{n} {med([r[3][n] for r in w]):.3g}" for n in watch))
    for r in log[RESUME - 2:RESUME + 3]:
        print(f"step {r[0]}: loss {r[1]:.4f} total {r[2]:.4g} "
              + ", ".join(f"{n} {r[3][n]:.3g}" for n in watch))
    below = [n for n in names if med([r[3][n] for r in log[RESUME + 1:]]) <
             1e-3 * med([r[3][n] for r in log[RESUME - 50:RESUME]])]
    print(f"{len(below)} of {len(names)} parameters' grad-norm medians fell below 1/1000 "
          f"of their 150-199 medians: {below[:6]} ...")


if __name__ == "__main__":
    main()
