"""A tanh RNN (no clipping, Adam) learns a memory task; at the start of step 150 its recurrent
weight ``rnn.weight_hh_l0`` is multiplied by 3 in place (a snapshot-merging bug that sums
three copies of the recurrent matrix instead of averaging them). The recurrence becomes
chaotic (spectral radius 0.955 -> 2.86), backpropagation through the 50 time steps amplifies
the gradient geometrically, and from step 150 on the gradient norm is 10-300,000x its
pre-bug level for the rest of the run.

What it does: inputs are 50 steps of 2-channel Gaussian noise; the target is 0.4 x the
exponentially weighted (0.9^age) sum of channel 0 minus the mean of channel 1 over the last
10 steps. Fresh batch of 32 per step. Model: ``rnn`` = nn.RNN(2, 64, tanh) with an orthogonal
recurrent init scaled to 0.8 and zero recurrent bias, linear head on the last hidden state.
Adam(lr 2e-3, constant), MSE, 300 steps, no clipping. Adam bounds each update, so nothing
becomes NaN: the weights stay in the chaotic regime (radius 2.85-3.17 until the end) and the
gradients stay exploded.

What is TRUE of the run (measured; printed at the end):
- Steps 0-149 are healthy: loss 1.06 at step 0, 25-step window means 0.437, 0.066, 0.041,
  0.038, 0.021, 0.026 (loss 0.017 at step 149); gradient norm median 1.22 (window medians
  2.96, 1.59, 1.09, 1.11, 0.77, 1.24), max 6.9 at step 11. Spectral radius of weight_hh
  0.80 at step 0, 0.955 at step 149.
- Step 150 (the first forward pass with the tripled matrix): loss 21.7, gradient norm 2.5e4
  (weight_hh 1.7e4, weight_ih 1.3e4, biases ~1e4, head 62). Step 151: 1.2e4; step 152: 3.3e5
  (the run's maximum); step 153: 9.0e3; step 154: 5.9e4; afterwards erratic between ~2 and
  ~1e4: 25-step window medians 52.7, 17.3, 8.4, 35.7, 24.2, 28.2 over steps 150-299;
  post-bug median 25.2 (20x the pre-bug median); 96 of the 150 post-bug steps exceed 10x the
  pre-bug median.
- The explosion comes through the recurrence, but every RNN parameter receives it about
  equally (post-bug median gradient: weight_hh 11.1, weight_ih 10.5, bias_ih/bias_hh 10.7;
  each is the largest parameter gradient on 29-43 of the post-bug steps), so no single
  parameter stands out as the subject.
- Loss after the bug: 21.7-22.9 over steps 150-152, then 25-step window means 8.02, 1.22,
  0.92, 0.88, 0.91, 0.96 -- stuck ~40x above its pre-bug level, not trending up.
- LR constant 2e-3. No NaN/Inf.
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
        {"id": "gradient_explosion", "first_step": 150, "tolerance": 1},
    ],
}

SEQ, HIDDEN, BATCH, STEPS, LR, BUG_STEP = 50, 64, 32, 300, 2e-3, 150
FACTOR = 3.0


def sample(g, n):
    """Inputs: 2 channels of noise; target: exponentially weighted sum of channel 0 minus the
    mean of channel 1 over the last 10 steps (needs memory of ~10-20 steps)."""
    x = torch.randn(n, SEQ, 2, generator=g)
    decay = 0.9 ** torch.arange(SEQ - 1, -1, -1, dtype=torch.float32)
    y = 0.4 * (x[:, :, 0] * decay).sum(1) - x[:, -10:, 1].mean(1)
    return x, y


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(2, HIDDEN, nonlinearity="tanh", batch_first=True)
        self.head = nn.Linear(HIDDEN, 1)
        with torch.no_grad():
            nn.init.orthogonal_(self.rnn.weight_hh_l0)
            self.rnn.weight_hh_l0.mul_(0.8)
            self.rnn.bias_hh_l0.zero_()

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1]).squeeze(1)


def spectral_radius(w):
    return torch.linalg.eigvals(w.detach()).abs().max().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    losses, per = [], {n: [] for n, _ in model.named_parameters()}
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            if step == BUG_STEP:
                with torch.no_grad():
                    w = model.rnn.weight_hh_l0
                    w.mul_(FACTOR)
            x, y = sample(g, BATCH)
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            for n, p in model.named_parameters():
                per[n].append(p.grad.norm().item())
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
            if step % 25 == 0 or BUG_STEP - 2 <= step <= BUG_STEP + 15:
                gn = math.sqrt(sum(v[-1] ** 2 for v in per.values()))
                print(f"step {step} loss {loss.item():.4g} gn {gn:.4g} "
                      f"w_hh {per['rnn.weight_hh_l0'][-1]:.4g} "
                      f"w_ih {per['rnn.weight_ih_l0'][-1]:.4g} "
                      f"head {per['head.weight'][-1]:.4g} "
                      f"radius {spectral_radius(model.rnn.weight_hh_l0):.3f}", flush=True)
            if not math.isfinite(loss.item()):
                print(f"non-finite loss at step {step}: stopping")
                break
    w = 25
    print("WINDOW_MEANS", [round(sum(losses[i:i + w]) / w, 4) for i in range(0, STEPS, w)])
    total = [math.sqrt(sum(v[i] ** 2 for v in per.values())) for i in range(len(losses))]
    pre, post = torch.tensor(total[:BUG_STEP]), torch.tensor(total[BUG_STEP:])
    print("GN pre-bug median", round(pre.median().item(), 4), "max", round(pre.max().item(), 4),
          "at", int(pre.argmax()))
    print("GN window medians", [round(torch.tensor(total[i:i + w]).median().item(), 4)
                                for i in range(0, STEPS, w)])
    print("GN post-bug median", round(post.median().item(), 2), "max", round(post.max().item(), 1),
          "at", BUG_STEP + int(post.argmax()),
          "steps >10x pre median:", int((post > 10 * pre.median()).sum()), "of", len(post))
    for n, v in per.items():
        a, b = torch.tensor(v[:BUG_STEP]), torch.tensor(v[BUG_STEP:])
        largest = sum(1 for i in range(BUG_STEP, len(v)) if v[i] == max(p[i] for p in per.values()))
        print(f"  {n}: pre median {a.median().item():.4g}, post median {b.median().item():.4g}, "
              f"largest param grad at {largest} post-bug steps")


if __name__ == "__main__":
    main()
