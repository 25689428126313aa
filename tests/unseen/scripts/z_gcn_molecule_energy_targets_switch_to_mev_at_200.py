"""Graph convolutional network (Kipf & Welling propagation D^-1/2 (A+I) D^-1/2, 3 layers of
64 units with ReLU and residuals, sum readout, MLP 64-64-1) regressing a per-molecule energy
on synthetic "molecules": 8-20 atoms of 5 types, a random spanning tree plus a few ring
bonds; energy (eV) = sum of per-type atomic energies + sum over bonds of a pair term + noise.
Targets are standardised with the mean/std of 512 molecules measured once at start-up (in
eV). MSE on the standardised target, Adam(1e-3), batch 16 graphs (padded dense adjacency),
400 steps.

What changes at step 200: a BUG. From step 200 the loader reads a new data shard written by
another pipeline, whose energies are in meV (x1000); the normaliser is left unchanged, so the
standardised targets jump from O(1) to about -3200 (std units) for the rest of the run.
The MSE jumps by 7 orders of magnitude and the gradient norm by 5, and neither comes back:
Adam can only move the weights by ~lr per step, far too slowly to reach the new targets (the
loss is still 3e5x its old level at the end). An expert wants the loss leaving its level at
step 200 and never returning flagged first; the gradient jump comes with it.

What is TRUE of the run (measured with plain torch in this script, recorder on; grad norm =
total L2 norm of all parameter gradients right before ``opt.step()``; medians over 20-step
windows):
- normaliser: mean -76.39 eV, std 23.97 eV.
- loss: median 0.427 over steps 180-199, 1.18e7 over 200-219 (x2.8e7), 6.06e6 over 220-239,
  1.32e5 over the last 20 (x3.1e5 the old level); values 0.294 at 199, 1.34e7 at 200, 9.20e6
  at 201. 40-step medians 0.770 0.600 0.524 0.494 0.460 | 9.6e6 3.6e5 1.6e5 1.5e5 1.4e5.
- grad norm: median 1.50 over 180-199, 2.71e5 over 200-219 (x1.8e5), 5.60e6 over 220-239,
  7.80e5 over the last 20; 1.12 at 199, 4.54e4 at 200, 3.50e4 at 201. 40-step medians ~1.5-2.0
  before, 1.6e6 2.9e6 6.5e5 6.5e5 7.8e5 after.
- LR constant 1e-3. No NaN or inf. About 7-9 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "loss_divergence", "first_step": 200, "tolerance": 1}]}

STEPS, BATCH, TYPES, HID, SWITCH = 400, 16, 5, 64, 200
ATOM_E = torch.tensor([-13.6, -37.8, -54.4, -75.0, -99.7]) / 10      # eV, per type
PAIR = torch.tensor([[-0.9, -1.2, -1.0, -0.8, -0.6],
                     [-1.2, -3.6, -3.0, -3.7, -2.9],
                     [-1.0, -3.0, -2.4, -2.1, -1.8],
                     [-0.8, -3.7, -2.1, -1.5, -1.9],
                     [-0.6, -2.9, -1.8, -1.9, -1.6]])


def molecule(g):
    n = int(torch.randint(8, 21, (1,), generator=g))
    types = torch.multinomial(torch.tensor([0.4, 0.3, 0.12, 0.12, 0.06]), n, True, generator=g)
    adj = torch.zeros(n, n)
    for i in range(1, n):
        j = int(torch.randint(0, i, (1,), generator=g))
        adj[i, j] = adj[j, i] = 1
    for _ in range(int(torch.randint(0, 3, (1,), generator=g))):
        i, j = torch.randint(0, n, (2,), generator=g).tolist()
        if i != j:
            adj[i, j] = adj[j, i] = 1
    bonds = torch.triu(adj, 1).nonzero()
    energy = ATOM_E[types].sum() + PAIR[types[bonds[:, 0]], types[bonds[:, 1]]].sum()
    energy = energy + 0.05 * torch.randn((), generator=g)
    return types, adj, float(energy)


def collate(mols):
    N = max(len(t) for t, _, _ in mols)
    x = torch.zeros(len(mols), N, TYPES + 1)
    a = torch.zeros(len(mols), N, N)
    mask = torch.zeros(len(mols), N)
    for b, (t, adj, _) in enumerate(mols):
        n = len(t)
        x[b, torch.arange(n), t] = 1
        x[b, :n, TYPES] = adj.sum(1) / 4
        a_hat = adj + torch.eye(n)
        d = a_hat.sum(1).rsqrt()
        a[b, :n, :n] = d[:, None] * a_hat * d[None, :]
        mask[b, :n] = 1
    return x, a, mask


class GCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(TYPES + 1, HID)
        self.layers = nn.ModuleList(nn.Linear(HID, HID) for _ in range(3))
        self.readout = nn.Sequential(nn.Linear(HID, HID), nn.ReLU(), nn.Linear(HID, 1))

    def forward(self, x, a, mask):
        h = self.inp(x)
        for lin in self.layers:
            h = h + F.relu(a @ lin(h))
        h = h * mask.unsqueeze(-1)
        return self.readout(h.sum(1) / 10).squeeze(1)


def grad_norm(model):
    return math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()
                         if p.grad is not None))


def report(n_change, rows, names):
    med = statistics.median
    for j, name in enumerate(names):
        col = [r[j] for r in rows]
        b = med(col[n_change - 20:n_change])
        a = med(col[n_change:n_change + 20])
        print(f"[{name}] med {n_change - 20}-{n_change - 1}: {b:.4g}  {n_change}-{n_change + 19}: "
              f"{a:.4g} (x{a / b:.3g})  {n_change + 20}-{n_change + 39}: "
              f"{med(col[n_change + 20:n_change + 40]):.4g}  last20: {med(col[-20:]):.4g}  "
              f"at {n_change - 1},{n_change},{n_change + 1}: "
              + ", ".join(f"{v:.4g}" for v in col[n_change - 1:n_change + 2])
              + f"  step0: {col[0]:.4g}  nonfinite: {sum(not math.isfinite(v) for v in col)}")
        print(f"[{name}] 40-step medians: "
              + " ".join(f"{med(col[a:a + 40]):.4g}" for a in range(0, len(col), 40)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(23)
    ref = torch.tensor([molecule(g)[2] for _ in range(512)])
    mean, std = float(ref.mean()), float(ref.std())
    print(f"normaliser (eV): mean {mean:.3f} std {std:.3f}")
    model = GCN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt,
                  hparams={"target_mean": mean, "target_std": std}) as rec:
        for step in range(STEPS):
            mols = [molecule(g) for _ in range(BATCH)]
            x, a, mask = collate(mols)
            unit = 1000.0 if step >= SWITCH else 1.0          # the meV shard (the bug)
            y = (torch.tensor([m[2] for m in mols]) * unit - mean) / std
            pred = model(x, a, mask)
            loss = F.mse_loss(pred, y)
            opt.zero_grad()
            loss.backward()
            gn = grad_norm(model)
            opt.step()
            rec.step(loss=loss)
            rows.append((loss.item(), gn))
            if step % 40 == 0:
                print(f"step {step} loss {loss.item():.4g} gnorm {gn:.4g}", flush=True)
    report(SWITCH, rows, ("loss", "gnorm"))


if __name__ == "__main__":
    main()
