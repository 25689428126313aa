"""MLP classifier whose ExponentialLR (meant per epoch) is stepped every batch: the LR vanishes.

What it does: a 3-layer ReLU MLP learns a teacher-student task (labels are the argmax of a
fixed random 2-layer network of 64 inputs, 10 classes) with Adam(lr=1e-3). The author meant
scheduler.step() once per epoch but calls it after every optimizer step, so
lr(step) = 1e-3 * 0.87**step: 1e-4 at step 17, 1e-6 at step 50, ~1e-18 by step 250. With
Adam each parameter moves by about lr per step, so the movement left after step k is
~7.7 * lr(k): 90% of all the learning this run will ever do is done by step ~17. 300 steps,
DataLoader of 8192 samples (batch 256), the recorder reads the LR from the optimizer.

What is TRUE of the run: the loss falls from 2.3 to ~1.71 over the first ~18 steps and is
then flat (only minibatch noise, ~0.04) for the remaining ~280 steps, far above what the
model reaches (the same run with a constant lr, --gamma 1.0, is at ~0.53 by step 275 and still
improving): a loss plateau from about step 20, caused by the learning rate decaying to ~0
(a scheduler stepped per batch instead of per epoch). Gradients stay normal-sized (grad norm
~0.55 throughout, not vanishing gradients); nothing diverges or spikes. The fix is the
schedule: step the scheduler per epoch, or use a gamma meant for per-step decay.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_plateau", "first_step": 20, "tolerance": 15, "top": True},
    ],
    "forbidden": ["vanishing_gradient", "loss_divergence", "loss_spike",
                  "gradient_explosion", "nonfinite", "dataloader_bottleneck"],
}

STEPS = 300
DIM = 64


def make_data(n, g):
    """Teacher-student: labels are the argmax of a fixed random 2-layer ReLU network."""
    x = torch.randn(n, DIM, generator=g)
    tg = torch.Generator().manual_seed(7)
    w1, w2 = torch.randn(DIM, 64, generator=tg) / 8, torch.randn(64, 10, generator=tg)
    return x, (torch.relu(x @ w1) @ w2).argmax(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--gamma", type=float, default=0.87)   # 1.0: the intended, constant-lr run
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x, y = make_data(8192, g)
    loader = DataLoader(TensorDataset(x, y), batch_size=256, shuffle=True, generator=g)

    model = nn.Sequential(nn.Linear(DIM, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=args.gamma)
    loss_fn = nn.CrossEntropyLoss()

    step = 0
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0) as rec:
        while step < STEPS:
            for xb, yb in rec.wrap_loader(loader):
                loss = loss_fn(model(xb), yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                rec.step(loss=loss)
                if step % 25 == 0:
                    print(step, f"{opt.param_groups[0]['lr']:.1e}", round(loss.item(), 4))
                sched.step()            # BUG: per-epoch schedule stepped per batch
                step += 1
                if step >= STEPS:
                    break


if __name__ == "__main__":
    main()
