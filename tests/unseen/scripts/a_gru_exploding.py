"""A vanilla tanh RNN whose recurrent matrix starts with spectral radius 3: gradients explode.

What it does: the adding problem (Hochreiter & Schmidhuber): sequences of 50 steps with two
input channels (a value in [0, 1) and a marker that is 1 at two random positions); the target
is the sum of the two marked values. Model: ``nn.RNN(2, 64, nonlinearity="tanh")`` named
``rnn`` + a linear head on the last hidden state. The recurrent weight ``rnn.weight_hh_l0`` is
initialised as a Gaussian matrix rescaled to spectral radius 3 (a "make it remember longer"
init gone wrong; ~1 is the usual choice). 6400 sequences, DataLoader batch 32, 200 steps of
plain SGD(lr=0.01), MSE, no gradient clipping.

What is TRUE of the run (ground truth):
- With spectral radius 3 the recurrence is chaotic: backpropagation through the 50 steps
  multiplies the gradient by the recurrent Jacobian at every step, so at step 0 the total
  gradient norm is ~1e5-1e6 (with spectral radius ~1 the same model has ~5). That is a
  gradient explosion, sharp, at step 0, and its cause is the recurrent weight
  ``rnn.weight_hh_l0`` (the explosion happens through the recurrence; all RNN parameters,
  input weights and biases included, receive the exploded gradient, but the input weights
  are not the cause).
- The one unclipped SGD update of step 0 moves the RNN weights by ~1e3, which pins ~99% of
  the tanh hidden units at ±1 for the rest of the run; from step 1 the gradient norm is
  back to ~0.1-5 and the model learns almost nothing: the loss stays near the predict-the-mean
  baseline (~0.17). No NaN/Inf occurs.
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
         "subject": "weight_hh"},
    ],
    "forbidden": ["nonfinite", "dataloader_bottleneck", "memory_leak"],
}

SEQ, HIDDEN, BATCH, STEPS, RADIUS = 50, 64, 32, 200, 3.0


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    n = BATCH * STEPS
    values = torch.rand(n, SEQ, generator=g)
    marks = torch.zeros(n, SEQ)
    pos = torch.rand(n, SEQ, generator=g).argsort(1)[:, :2]
    marks.scatter_(1, pos, 1.0)
    target = (values * marks).sum(1, keepdim=True)
    return TensorDataset(torch.stack([values, marks], -1), target)


class AddingRNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.RNN(2, HIDDEN, nonlinearity="tanh", batch_first=True)
        self.head = nn.Linear(HIDDEN, 1)
        with torch.no_grad():
            w = self.rnn.weight_hh_l0
            w.normal_(0.0, HIDDEN ** -0.5)
            w.mul_(RADIUS / torch.linalg.eigvals(w).abs().max())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    loader = DataLoader(make_data(), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    model = AddingRNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0) as rec:
        for x, y in rec.wrap_loader(loader):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
    for a in range(0, STEPS, 25):
        print(f"steps {a:3d}-{a + 24:3d}: mean loss {sum(losses[a:a + 25]) / 25:.3f}")


if __name__ == "__main__":
    main()
