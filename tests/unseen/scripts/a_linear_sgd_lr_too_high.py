"""Linear regression trained with plain SGD at a learning rate far above the stability limit.

What it does: 20 standardized features (1024 rows, a noisy linear target, also standardized),
``nn.Linear(20, 1)`` with MSE and ``torch.optim.SGD(lr=1.9)``, mini-batches of 64 from a
shuffled DataLoader, 60 optimizer steps. The largest eigenvalue of the loss Hessian
(2/n · [X 1]ᵀ[X 1]) is about 2.45, so gradient descent is stable only for lr < 2/λ_max ≈ 0.82:
at lr = 1.9 every step multiplies the error along the top eigenvector by |1 - lr·λ| ≈ 3.7.

What is TRUE of the run (ground truth):
- Gradient explosion from the very first step: the gradient norm grows geometrically (×~3–4
  per step) from step 0 on; it is the root cause (learning rate too high for the curvature).
- The training loss overflows float32 and becomes +inf at step 36 (MSE of residuals ~1e19);
  the gradient's L2 norm itself overflows float32 one step later (37), while the individual
  gradient values and the weights stay finite (~1e30-1e33) until the run ends at step 59.
  The loop does not stop on inf. So: nonfinite from step 36, a consequence of the explosion.
- Nothing about data loading, memory or step times is abnormal.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "gradient_explosion", "first_step": 0, "tolerance": 3, "top": True},
        {"id": "nonfinite", "first_step": 36, "tolerance": 1},
    ],
    "forbidden": ["dataloader_bottleneck", "memory_leak", "loss_plateau",
                  "vanishing_gradient"],
}

N, P, STEPS, LR = 1024, 20, 60, 1.9


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, P, generator=g)
    w = torch.randn(P, 1, generator=g)
    y = x @ w + 0.1 * torch.randn(N, 1, generator=g)
    x = (x - x.mean(0)) / x.std(0)
    y = (y - y.mean()) / y.std()
    return TensorDataset(x, y)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    data = make_data()
    xa = torch.cat([data.tensors[0], torch.ones(N, 1)], 1)
    lam = torch.linalg.eigvalsh(2 * xa.T @ xa / N).max().item()
    print(f"lambda_max={lam:.3f}  2/lambda_max={2 / lam:.3f}  lr={LR}")

    loader = DataLoader(data, batch_size=64, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(1))
    model = nn.Linear(P, 1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    step, first_inf = 0, None
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0) as rec:
        while step < STEPS:
            for x, y in rec.wrap_loader(loader):
                loss = nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                rec.step(loss=loss)
                if first_inf is None and not torch.isfinite(loss):
                    first_inf = step
                step += 1
                if step >= STEPS:
                    break
    print(f"first nonfinite loss at step {first_inf}")


if __name__ == "__main__":
    main()
