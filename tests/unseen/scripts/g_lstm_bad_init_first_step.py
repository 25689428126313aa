"""LSTM sequence model whose recurrent weights start ~8x too large: the gradient explodes at step 0.

What it does: a delayed-recall task. Inputs are sequences of 40 tokens drawn uniformly from a
vocabulary of 16; at every position t >= 3 the target is the token seen 3 positions earlier
(x[t-3]), so the model has to keep the last three tokens in its recurrent state. Model:
``nn.Embedding(16, 32)`` (``emb``) -> ``nn.LSTM(32, 64, batch_first=True)`` (``lstm``) ->
``nn.Linear(64, 16)`` (``head``) at every position, cross-entropy. The recurrent matrix
``lstm.weight_hh_l0`` is re-initialised as N(0, (8/sqrt(64))^2), i.e. 8x the usual 1/sqrt(H)
scale and ~14x the std of PyTorch's default U(-1/8, 1/8) -- a mistaken "make it remember
longer" init. Fresh batch of 32 sequences per step (fixed seeded data), 250 steps of
plain SGD(lr=1.0), no momentum, no gradient clipping.

What is TRUE of the run (ground truth, measured while writing it):
- Step 0: total gradient norm ~1.3e4. The same script with the recurrent std at 1/sqrt(64)
  has ~0.08 at step 0, and this run itself settles at ~0.12-0.18 from step 1 on, i.e. step 0
  is ~1e5x the level the run settles at. The explosion happens through the recurrence (BPTT
  through the too-large ``lstm.weight_hh_l0``); every LSTM parameter and the embedding get the
  exploded gradient -- measured per tensor at step 0: lstm.weight_ih_l0 1.3e4 (the largest,
  because it multiplies the O(1) embeddings), lstm.bias_ih/bias_hh 2.3e3 each,
  lstm.weight_hh_l0 1.4e3, emb.weight 9.2e2 -- while the head gets ~0.1 (normal). The cause
  is the recurrent weight ``lstm.weight_hh_l0`` (with it at a sane scale every one of these
  is <0.05), not the input weights that happen to receive the largest share.
- The single unclipped SGD update of step 0 moves the LSTM weights by 1e3-1e4 (norm of the
  change per tensor = its gradient norm above) and wrecks the recurrent layer for the rest
  of the run: from step 1 the total gradient norm is ~0.12-0.18, almost all of it in the head
  (the LSTM tensors get <0.02, weight_hh ~5e-4) and the model learns almost nothing:
  loss 2.79 at step 0 (chance ln 16 =
  2.77), 2.82 at step 1, still ~2.67 at the end (25-step mean). The identical script with a
  sane recurrent init reaches ~0.7 by step 250. Only step 0 is exploded; no NaN/Inf occurs.
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "gradient_explosion", "first_step": 0, "tolerance": 1, "top": True,
         "subject": "weight_hh"},
    ],
    "forbidden": ["nonfinite", "dataloader_bottleneck", "memory_leak"],
}

VOCAB, SEQ, DELAY, EMB, HIDDEN, BATCH, STEPS, HH_SCALE = 16, 40, 3, 32, 64, 32, 250, 8.0


class DelayedRecall(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, EMB)
        self.lstm = nn.LSTM(EMB, HIDDEN, batch_first=True)
        self.head = nn.Linear(HIDDEN, VOCAB)
        with torch.no_grad():
            self.lstm.weight_hh_l0.normal_(0.0, HH_SCALE / HIDDEN ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.emb(x))
        return self.head(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = torch.randint(0, VOCAB, (STEPS, BATCH, SEQ), generator=torch.Generator().manual_seed(0))

    model = DelayedRecall()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    losses, norms = [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x = data[step]
            logits = model(x)[:, DELAY:]
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                               x[:, :-DELAY].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norms.append(torch.norm(torch.stack(
                [p.grad.norm() for p in model.parameters()])).item())
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
    print("grad norms steps 0-4:", " ".join(f"{n:.3g}" for n in norms[:5]))
    for a in range(0, STEPS, 25):
        print(f"steps {a:3d}-{a + 24:3d}: mean loss {sum(losses[a:a + 25]) / 25:.3f}  "
              f"max grad norm {max(norms[a:a + 25]):.3g}")


if __name__ == "__main__":
    main()
