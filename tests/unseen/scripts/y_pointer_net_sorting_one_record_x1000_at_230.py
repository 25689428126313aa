"""Pointer network (Vinyals et al. 2015, with a Set-Transformer-style encoder) that learns to
sort 10 points of the unit square by angle around their centroid (counter-clockwise from
-pi): each point is embedded by Linear(2->64), encoded by two pre-LN transformer encoder
layers (4 heads, no positional encoding: the input is a set), and a GRUCell decoder emits
10 pointers; the logits of step t are scaled dot products between the decoder state and the
encoded elements, with already-chosen elements masked. Teacher forcing: the decoder is fed
the encoding of the true previous element. Cross-entropy over the
10 pointer steps (ln 10 = 2.303 for a uniform first pointer). SGD (lr 0.05, momentum 0.9),
no clipping.

Data: a map-style Dataset of 12,800 records (10 points ~ U(0, 1)^2, seeded by index) read
through a shuffled torch DataLoader (batch 32, seeded sampler) wrapped by rec.wrap_loader:
exactly one epoch, 400 steps, each record seen once. One record (id CORRUPT_ID) was written by a
different exporter in milli-units: its coordinates are x1000 (0..1000). The target (an
angular order) is the same at any scale; the model's logits are not. The id is the one the
sampler puts in batch 230 (position 7), so it is trained on at step 230 only.

What is TRUE of the run (measured by this script with plain torch, printed below):
- Steps 0-229 train normally: loss 1.50 at step 0, mean 1.11 over steps 0-24, 0.25 over
  100-149, 0.21 over 180-229 (max 0.33); gradient norm median 1.2 (max 2.7) over 180-229;
  pointer accuracy 0.93 over 180-229.
- The corrupted record (id 825 with these seeds) is in the batch of step 230 only (row 7).
  Step 230: loss 1502 (that row's loss 48,064; the other 31 rows 0.171, like the steps
  before), gradient norm 5.9e4 (vs ~1). Its update throws the weights: step 231 loss 3.5e6
  (gradient norm 4.3e7), step 232 loss 6.6e23 (gradient norm 1.7e26, still finite), and from
  step 233 to the end (167 steps) loss and every gradient element are NaN; pointer accuracy
  at chance (0.27-0.33) from 232.
- Root cause: one bad record -> loss spike at step 230 (the batch's sampler ids hold 825);
  the NaN from 233 is its consequence.
- About 10 s on 2 cores (1 thread).
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "loss_spike", "first_step": 230, "tolerance": 1},
                       {"id": "nonfinite", "first_step": 233, "tolerance": 1}]}

N, STEPS, BATCH, DIM, LEN = 12_800, 400, 32, 64, 10
BAD_STEP, BAD_POS, SCALE, SAMPLER_SEED = 230, 7, 1000.0, 1234


class SortRecords(Dataset):
    def __init__(self, n, corrupt_id):
        self.n, self.corrupt_id = n, corrupt_id

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(10_000 + i)
        x = torch.rand(LEN, 2, generator=g)
        c = x - x.mean(0)
        y = torch.argsort(torch.atan2(c[:, 1], c[:, 0]))        # counter-clockwise from -pi
        if i == self.corrupt_id:
            x = x * SCALE
        return x, y


class PointerNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(2, DIM)
        layer = nn.TransformerEncoderLayer(DIM, 4, 128, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.start = nn.Parameter(torch.zeros(DIM))
        self.decoder = nn.GRUCell(DIM, DIM)
        self.query = nn.Linear(DIM, DIM)
        self.key = nn.Linear(DIM, DIM)

    def forward(self, x, target):
        enc = self.encoder(self.embed(x))                      # (B, L, D)
        keys = self.key(enc)
        b = x.shape[0]
        h = enc.mean(1)
        inp = self.start.expand(b, DIM)
        used = torch.zeros(b, LEN, dtype=torch.bool)
        logits = []
        for t in range(LEN):
            h = self.decoder(inp, h)
            score = torch.einsum("bd,bld->bl", self.query(h), keys) / math.sqrt(DIM)
            logits.append(score.masked_fill(used, -1e9))
            chosen = target[:, t]
            used = used.clone()
            used[torch.arange(b), chosen] = True
            inp = enc[torch.arange(b), chosen]
        return torch.stack(logits, 1)                           # (B, L, L)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    peek = DataLoader(list(range(N)), batch_size=BATCH, shuffle=True,     # same draws, ids only
                      generator=torch.Generator().manual_seed(SAMPLER_SEED))
    corrupt_id = int(list(peek)[BAD_STEP][BAD_POS])
    ds = SortRecords(N, corrupt_id)
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=0,
                        generator=torch.Generator().manual_seed(SAMPLER_SEED))
    model = PointerNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step, (x, y) in enumerate(rec.wrap_loader(loader)):
            logits = model(x, y)
            per_sample = F.cross_entropy(logits.reshape(-1, LEN), y.reshape(-1),
                                         reduction="none").view(-1, LEN).mean(1)
            loss = per_sample.mean()
            opt.zero_grad()
            loss.backward()
            gn = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.double())
                                                       for p in model.parameters()])).item()
            bad_grads = sum(int((~torch.isfinite(p.grad)).sum()) for p in model.parameters())
            opt.step()
            rec.step(loss=loss)
            with torch.no_grad():
                acc = (logits.argmax(-1) == y).float().mean().item()
            big = (x.abs().flatten(1).amax(1) > 10).nonzero().flatten().tolist()
            rows.append((step, loss.item(), gn, acc, big, per_sample.detach(), bad_grads))
            if step % 25 == 0 or BAD_STEP - 3 <= step <= BAD_STEP + 5 or big:
                extra = (f" corrupted rows in batch: {big}, their loss "
                         f"{[round(per_sample[i].item(), 1) for i in big]}" if big else "")
                print(f"step {step} loss {loss.item():.4g} grad_norm {gn:.4g} nonfinite grads "
                      f"{bad_grads} pointer_acc {acc:.3f}{extra}", flush=True)
    print(f"[data] corrupt id {corrupt_id}; steps whose batch held it: "
          f"{[r[0] for r in rows if r[4]]}; total steps {len(rows)}")
    for a, b in ((0, 24), (100, 149), (180, 229), (231, 260), (261, 300), (301, 350), (351, 399)):
        part = rows[a:b + 1]
        print(f"[win] steps {a}-{b}: loss mean {sum(r[1] for r in part) / len(part):.4f} "
              f"max {max(r[1] for r in part):.4f}; grad norm median "
              f"{sorted(r[2] for r in part)[len(part) // 2]:.4g} "
              f"max {max(r[2] for r in part):.4g}; "
              f"pointer acc mean {sum(r[3] for r in part) / len(part):.3f}")
    nf_loss = next((r[0] for r in rows if not math.isfinite(r[1])), None)
    nf_grad = next((r[0] for r in rows if r[6]), None)
    print(f"[nonfinite] first nonfinite loss at step {nf_loss}, first nonfinite gradient "
          f"element at step {nf_grad}; nonfinite losses in steps {nf_loss}-{STEPS - 1}: "
          f"{sum(not math.isfinite(r[1]) for r in rows)}")
    r = rows[BAD_STEP]
    clean = torch.cat([r[5][:BAD_POS], r[5][BAD_POS + 1:]])
    print(f"[bad step] step {BAD_STEP}: loss {r[1]:.4f}; the other 31 rows' mean loss "
          f"{clean.mean().item():.4f}; grad norm {r[2]:.4g}")


if __name__ == "__main__":
    main()
