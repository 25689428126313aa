"""A 16-layer plain MLP (Linear + Sigmoid, no residuals, no normalisation, PyTorch default init)
on a tabular 4-class task, SGD with momentum: VANISHING GRADIENTS in the early layers.

What it does: 20 Gaussian features, 4 classes from a random 2-layer tanh teacher (class
shares 0.20/0.25/0.28/0.27); a plain MLP of 16 Linear layers (20-64, 14 x 64-64, 64-4) with a
Sigmoid after each hidden Linear (net.0, net.2, ..., net.28, head net.30), PyTorch's default
init, no residuals, no normalisation. SGD(lr 0.05, momentum 0.9), batch 128, 400 steps over
fresh rows.

What is TRUE of the run (measured, per-parameter gradient norms of the weights, mean over the
run; each layer's gradient is ~7x smaller than the next one's):
  net.30 (head) 0.34, net.28 5.1e-2, net.26 6.6e-3, net.24 9.1e-4, net.22 1.3e-4,
  net.20 1.8e-5, net.18 2.4e-6, net.16 3.7e-7, net.14 5.2e-8, net.12 7.0e-9, net.10 9.7e-10,
  net.8 1.5e-10, net.6 2.1e-11, net.4 2.5e-12, net.2 3.9e-13, net.0 7.8e-14.
  So from step 0 to the end every layer below the last four (net.22 and down) has a gradient
  under 1e-3 of the head's, and the first 8 layers (net.0-net.14) under 1e-6 of it.
- The forward signal is squashed too: the output barely depends on the input. The loss never
  moves: 1.389 at step 0, mean 1.385-1.394 in every 50-step window (prior entropy ~1.38,
  ln 4 = 1.386); train accuracy 0.26-0.27 throughout (majority class 0.28).
- Total grad norm median 0.34 (dominated by the head), no NaN/Inf.
- The cause is the vanishing gradient of the deep plain sigmoid stack, present from step 0.
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "vanishing_gradient", "first_step": 0, "tolerance": 20},
    ],
    "forbidden": ["gradient_explosion", "nonfinite", "loss_divergence", "memory_leak"],
}

STEPS, BATCH, FEATURES, WIDTH, DEPTH, CLASSES = 400, 128, 20, 64, 16, 4


def make_data(n, g):
    """Labels from a random 2-layer teacher: easily learnable by a shallow net."""
    w1 = torch.randn(FEATURES, 32, generator=g) / math.sqrt(FEATURES)
    w2 = torch.randn(32, CLASSES, generator=g) / math.sqrt(32)
    x = torch.randn(n, FEATURES, generator=g)
    y = (torch.tanh(x @ w1 * 2) @ w2).argmax(1)
    return x, y


class DeepSigmoidMLP(nn.Module):
    def __init__(self):
        super().__init__()
        layers = [nn.Linear(FEATURES, WIDTH), nn.Sigmoid()]
        for _ in range(DEPTH - 2):
            layers += [nn.Linear(WIDTH, WIDTH), nn.Sigmoid()]
        layers.append(nn.Linear(WIDTH, CLASSES))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    x_all, y_all = make_data(STEPS * BATCH, g)
    print("class shares", torch.bincount(y_all, minlength=CLASSES).float().div(len(y_all)).tolist())
    model = DeepSigmoidMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    linears = [m for m in model.net if isinstance(m, nn.Linear)]
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x = x_all[step * BATCH:(step + 1) * BATCH]
            y = y_all[step * BATCH:(step + 1) * BATCH]
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss, acc=(logits.argmax(1) == y).float().mean())
            if step % 50 == 0 or step == STEPS - 1:
                norms = [f"{m.weight.grad.norm().item():.1e}" for m in linears]
                print(f"step {step} loss {loss.item():.4f} weight-grad norms by layer {norms}",
                      flush=True)


if __name__ == "__main__":
    main()
