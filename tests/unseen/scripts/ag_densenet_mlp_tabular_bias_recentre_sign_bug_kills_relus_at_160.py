"""DenseNet-style MLP on tabular data; a bias "re-centring" at step 160 kills every ReLU.

What it does: 5-class classification of 20 Gaussian features (labels = argmax of a random
tanh teacher plus noise; class shares 0.15-0.27), 12,800 rows, DataLoader batch 64, 320
steps, Adam lr 2e-3, cross-entropy. Model ``DenseMLP``: ``stem`` (Linear 20->24 + ReLU),
a dense block of 4 layers ``block.0``..``block.3`` (each Linear + ReLU, 24 units, reading
the concatenation of the stem's and every earlier layer's output, as in DenseNet), and a
``classifier`` over the whole concatenation (120 -> 5). Every feature the classifier sees
is a ReLU output. At the start of step 160 (before its forward) a "re-centring" routine
with a units bug subtracts 10 x (row norm of the weight + 1), at least 10, from the bias of
every hidden Linear (``stem.fc``, ``block.*.fc``). Recorded with the debug preset (every
step: gradient norms per parameter; every 25 steps: activation statistics), profiler off.

What is TRUE of the run (measured):
- Steps 0-159 learn normally: 20-step median loss 1.561 -> 1.340 -> 1.036 -> 0.790 ->
  0.657 -> 0.617 -> 0.573 -> 0.593 (steps 140-159; step 159: 0.731); 51-57% of the stem's
  units are active on a batch; activation stats at step 150 show 24-43% zeros per ReLU;
  total gradient norm 0.43 (median, steps 0-19) rising to 1.3-1.5 (from step 60).
- From step 160 every pre-activation is far below 0 (rms ~17 at step 175), so all five
  ReLUs (``stem.act``, ``block.0.act``..``block.3.act``) output exactly 0 for every input
  (0% of units active; activation zero_frac 1.00 at steps 175, 200, ...). The gradients
  of every hidden weight and bias and of ``classifier.weight`` are exactly 0 from step
  160 on (per-parameter norms 0, zero_frac 1.00); only ``classifier.bias`` still learns,
  so the total gradient norm drops from 1.37 (step 159) to 0.13 (step 160; 0.09-0.15
  window medians after) and the units can never recover (Adam cannot move a parameter
  whose gradient is 0 once its momentum decays, and the biases are >=10 away).
- The network's output is a constant, so the loss jumps at step 160 (0.731 -> 1.617) and
  sits at 1.59-1.61 to the end (20-step medians 1.588-1.606): the class-prior entropy,
  1.589. That plateau is the consequence of the dead units, not a separate problem.
- No NaN/Inf, no explosion. ~8 s on 2 CPU cores.
- Ground truth: dead ReLU activations from step 160 (sharp), the root cause; the loss
  jump/plateau at the class prior follows from it.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "dead_activation", "first_step": 160, "tolerance": 1, "top": True},
    ],
    "forbidden": ["gradient_explosion", "nonfinite", "memory_leak", "dataloader_bottleneck"],
}

FEATURES, CLASSES, GROWTH, LAYERS, BATCH, STEPS, BUG_AT = 20, 5, 24, 4, 64, 320, 160


class DenseLayer(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.fc = nn.Linear(cin, GROWTH)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class DenseMLP(nn.Module):
    """A stem (Linear + ReLU), then a dense block: every layer sees the concatenation of the
    stem's and all earlier layers' outputs (Huang et al.'s connectivity, on vectors); the
    classifier reads the whole concatenation."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = DenseLayer(FEATURES)
        self.block = nn.ModuleList(DenseLayer(GROWTH * (i + 1)) for i in range(LAYERS))
        self.classifier = nn.Linear(GROWTH * (LAYERS + 1), CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = [self.stem(x)]
        for layer in self.block:
            feats.append(layer(torch.cat(feats, 1)))
        return self.classifier(torch.cat(feats, 1))


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    n = BATCH * 200
    x = torch.randn(n, FEATURES, generator=g)
    w = torch.randn(FEATURES, 16, generator=g)
    v = torch.randn(16, CLASSES, generator=g)
    y = (torch.tanh(x @ w / 3) @ v + 0.3 * torch.randn(n, CLASSES, generator=g)).argmax(1)
    return TensorDataset(x, y)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    loader = DataLoader(make_data(), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    model = DenseMLP()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    hidden = [model.stem, *model.block]
    losses, alive = [], []
    step = 0
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="debug",
                  profile_start=0) as rec:
        while step < STEPS:
            for x, y in rec.wrap_loader(loader):
                if step == BUG_AT:
                    # "re-centre the pre-activations on the running mean": meant to subtract a
                    # small per-unit mean, it subtracts the running mean of |pre-activation|
                    # scaled x10 (a units mix-up), pushing every bias far below zero.
                    with torch.no_grad():
                        for layer in hidden:
                            layer.fc.bias.sub_(10.0 * (layer.fc.weight.norm(dim=1) + 1.0))
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                rec.step(loss=loss)
                with torch.no_grad():
                    alive.append(float((model.stem(x) > 0).float().mean()))
                losses.append(loss.item())
                step += 1
                if step >= STEPS:
                    break
    for a in range(0, STEPS, 20):
        w = sorted(losses[a:a + 20])
        print(f"steps {a:3d}-{a + 19:3d}: median loss {w[10]:.4f}  "
              f"stem units active {alive[a + 19]:.3f}")


if __name__ == "__main__":
    main()
