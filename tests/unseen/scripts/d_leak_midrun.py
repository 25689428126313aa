"""LSTM sequence classifier; from step 150 on the loop keeps every step's hidden states.

What it does: binary classification of length-40 sequences of 8 features (class 1 sequences
carry a weak slow sinusoid in features 0-3 buried in Gaussian noise, class 0 pure noise);
a fresh batch of 32 each step, 300 steps. Model: 1-layer LSTM(8 → 64, batch_first) → mean
over time → linear(64 → 2); Adam(lr=2e-3), gradient clipping at norm 1.

The bug: at step PROBE_FROM = 150 a "probing" switch turns on (the user wants to fit linear
probes on hidden states of the trained half of the run) and from then on every step appends
the LSTM's full output ``h.detach()`` — a 32×40×64 float32 tensor, 327,680 bytes (320 KiB),
sharing storage with the activation so the whole buffer stays alive — to a list that is never
cleared. Steps 0-149 append nothing. (Each step's ``h`` is alive anyway while its own step
ends, so the first retained buffer — step 150's — shows in end-of-step memory from step 151 on.)

What is TRUE of the run (ground truth):
- Host memory is flat (after the first steps' warm-up) until step 149, then leaks from step
  150 to the end: the live heap grows by ≈320 KiB at every step, ≈47 MiB over 150 steps,
  linearly, with no plateau (memory_leak, first step 150). Measured: the live heap is between
  125.4 and 127.5 MiB from step 1 to 150, then rises by 320 KiB at every step, to 172.2 MiB.
- Training is otherwise healthy: the loss falls from ≈0.69 (ln 2) toward a small value;
  no divergence, no NaN/Inf.
"""

import argparse
import math

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "memory_leak", "first_step": 150, "tolerance": 15},
    ],
    "forbidden": ["loss_divergence", "nonfinite"],
}

STEPS, BATCH, SEQ, FEAT, HIDDEN = 300, 32, 40, 8, 64
PROBE_FROM = 150


def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.randint(0, 2, (BATCH,), generator=g)
    t = torch.arange(SEQ, dtype=torch.float32)
    phase = torch.rand(BATCH, 1, generator=g) * 2 * math.pi
    wave = torch.sin(0.3 * t[None, :] + phase)  # (B, SEQ)
    x = torch.randn(BATCH, SEQ, FEAT, generator=g)
    x[:, :, :4] += 0.8 * y[:, None, None].float() * wave[:, :, None]
    return x, y


class LSTMClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(FEAT, HIDDEN, batch_first=True)
        self.head = nn.Linear(HIDDEN, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, _ = self.rnn(x)
        return self.head(h.mean(1)), h


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)

    model = LSTMClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    probe_states = []  # the leak, from PROBE_FROM on: 320 KiB per step
    losses = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = batch(g)
            logits, h = model(x)
            loss = nn.functional.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step >= PROBE_FROM:
                probe_states.append(h.detach())  # "for linear probes later"
            rec.step(loss=loss)
            losses.append(loss.item())
    held = sum(s.untyped_storage().nbytes() for s in probe_states)
    print(f"loss first {losses[0]:.3f} last-10 mean {sum(losses[-10:]) / 10:.4f}; "
          f"probe_states holds {len(probe_states)} tensors, {held / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
