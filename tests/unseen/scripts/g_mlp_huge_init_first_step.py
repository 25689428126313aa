"""MLP classifier whose output layer is initialised 1000x too large: exploded gradient from step 0.

What it does: 10-class classification of 32-dim Gaussian inputs labelled by a fixed random
teacher network (argmax of tanh(x A) B); 300 x 64 training examples, DataLoader batch 64
(shuffled, seeded), 300 steps. Model: ``features`` = Linear(32,128)-ReLU-Linear(128,128)-ReLU,
``head`` = Linear(128, 10), cross-entropy. The mistake: ``head.weight`` is multiplied by 1000
after PyTorch's default init (e.g. a logit "temperature" or unit-conversion factor applied to
the wrong tensor). SGD(lr=0.05, momentum=0.9), no clipping.

What is TRUE of the run (ground truth, measured while writing it):
- Step 0: loss 136 (ln 10 = 2.30 with the default init) and total gradient norm 519; the
  identical script without the x1000 has 0.44 at step 0 and 0.4-2.4 throughout. The huge
  output weights multiply the backpropagated error, so the exploded gradient lands on the
  layers *below* the head: features.2.weight 470, features.0.weight 180, features.2.bias 130,
  features.0.bias 46, while head.weight itself gets a normal 0.57. The cause is the init of
  ``head.weight``.
- The unclipped momentum-SGD updates make it escalate at once: grad norm 519, 2.0e3, 4.9e3,
  9.3e3, 1.4e4 at steps 0-4, peaking ~1e6 around steps 14-16 (loss up to 2.7e8), until the
  huge updates leave 99% of the last hidden layer's ReLUs dead. From step 19 the grad norm
  is ~0.06-0.2, apart from two isolated relapses (steps 20 and 36: ~5e5 and ~6e5, loss
  ~5e7 and 1e7, when a rare surviving unit fires under the still-huge head); from step 37
  on it stays 0.06-0.2 to the end. The loss sits at ~2.29 (predicting the class prior) from
  step ~19, held-out accuracy at the end 13.1% = the majority-class rate: the model learned
  nothing. The same script with the normal head init reaches loss ~0.70 and ~69% held-out
  accuracy. No NaN/Inf occurs.
- So: a gradient explosion present from step 0 (the first recorded step), caused by the init
  of ``head.weight``, that wrecks the model for the rest of the run.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "gradient_explosion", "first_step": 0, "tolerance": 1, "top": True,
         "subject": "head.weight"},
    ],
    "forbidden": ["nonfinite", "dataloader_bottleneck", "memory_leak"],
}

D_IN, CLASSES, BATCH, STEPS, HEAD_SCALE = 32, 10, 64, 300, 1000.0


def make_data(gen: torch.Generator, n: int):
    a = torch.randn(D_IN, 64, generator=gen) / D_IN ** 0.5
    b = torch.randn(64, CLASSES, generator=gen) / 8
    x = torch.randn(n, D_IN, generator=gen)
    xt = torch.randn(4000, D_IN, generator=gen)
    label = lambda z: (torch.tanh(z @ a) @ b).argmax(1)  # noqa: E731
    return x, label(x), xt, label(xt)


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(D_IN, 128), nn.ReLU(),
                                      nn.Linear(128, 128), nn.ReLU())
        self.head = nn.Linear(128, CLASSES)
        with torch.no_grad():
            self.head.weight.mul_(HEAD_SCALE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    x, y, xt, yt = make_data(torch.Generator().manual_seed(0), STEPS * BATCH)
    torch.manual_seed(0)
    model = Classifier()
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses, norms = [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for xb, yb in rec.wrap_loader(loader):
            loss = nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norms.append(torch.norm(torch.stack(
                [p.grad.norm() for p in model.parameters()])).item())
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
    with torch.no_grad():
        acc = (model(xt).argmax(1) == yt).float().mean().item()
        dead = (model.features(xt).amax(0) <= 0).float().mean().item()
    print("steps 0-39 loss:", " ".join(f"{v:.3g}" for v in losses[:40]))
    print("steps 0-39 grad norm:", " ".join(f"{v:.3g}" for v in norms[:40]))
    for a in range(0, STEPS, 30):
        print(f"steps {a:3d}-{a + 29:3d}: mean loss {sum(losses[a:a + 30]) / 30:.3g}  "
              f"max grad norm {max(norms[a:a + 30]):.3g}")
    print(f"held-out accuracy {acc:.3f} (majority {torch.bincount(yt).max().item() / len(yt):.3f}),"
          f" dead last-hidden units {dead:.2f}")


if __name__ == "__main__":
    main()
