"""Healthy: knowledge distillation of a frozen teacher into a small residual-MLP student;
the distillation temperature is 4 for steps 0-199 and 1 from step 200 on (a planned
schedule). The recorded loss T^2 x KL(teacher_T || student_T) drops ~3x at step 200 because
it is a different quantity; the student keeps getting closer to the teacher.

What it does: the teacher is a frozen random 3-layer tanh MLP (20-128-128-10) whose logits
are multiplied by 25 (logit std ~3.9). Inputs are fresh standard-normal 20-d
vectors, batch 64. Student: Linear(20-64), two pre-norm residual blocks (LayerNorm,
64-128-64 GELU MLP), LayerNorm, Linear(64-10). Loss = T^2 x KL(softmax(t/T) ||
softmax(s/T)), batch mean (Hinton et al.). Adam(lr 2e-3, constant), 420 steps, no
clipping. The KL at T = 1 (the quantity that matters) is recorded every step as kl_at_t1.

What is TRUE of the run (measured; printed at the end):
- Steps 0-199 (T = 4): loss 5.94 at step 0, 20-step window medians 3.28, 1.23, 0.59, 0.42,
  0.35, 0.32, 0.31, 0.30, 0.26, 0.23; KL at T = 1 0.77 -> 0.075 (window medians); held-out
  teacher agreement 0.21 (step 0) -> 0.876 (199), held-out KL(T=1) 1.49 -> 0.070.
- Step 200 (T = 1): loss 0.212 (199) -> 0.069 (200); window medians over 200-419 0.069,
  0.071, 0.066, 0.074, 0.067, 0.066, 0.069, 0.064, 0.060, 0.064, 0.065.
- After the change the student keeps improving slowly: held-out KL(T=1) 0.070 (199) ->
  0.060 (419; 0.058 at step 360); teacher agreement 0.876 -> 0.883 (0.891 at 360).
- Gradient norm: 3.39 at step 0 (the run's maximum), median 0.90 over 100-199 and 0.58 over
  200-419 (window medians 0.53-0.70 after the change): it drops with the loss, no spike.
- LR constant 2e-3. No NaN/Inf. A healthy run: nothing above info.
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

D_IN, CLASSES, WIDTH, BATCH, STEPS, LR = 20, 10, 64, 64, 420, 2e-3
T_STEP, T_BEFORE, T_AFTER = 200, 4.0, 1.0


class Teacher(nn.Module):
    """A frozen 3-layer tanh MLP whose (sharpened) logits define the task."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D_IN, 128), nn.Tanh(), nn.Linear(128, 128),
                                 nn.Tanh(), nn.Linear(128, CLASSES))

    def forward(self, x):
        return 25.0 * self.net(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.ff = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(),
                                nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, h):
        return h + self.ff(self.norm(h))


class Student(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(D_IN, WIDTH)
        self.blocks = nn.Sequential(Block(), Block())
        self.out = nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, CLASSES))

    def forward(self, x):
        return self.out(self.blocks(self.inp(x)))


def kd_loss(s, t, temp):
    """Hinton et al.: T^2 * KL(softmax(t/T) || softmax(s/T)), batch mean."""
    return temp * temp * F.kl_div(F.log_softmax(s / temp, 1), F.log_softmax(t / temp, 1),
                                  reduction="batchmean", log_target=True)


def med(v):
    s = sorted(v)
    return s[len(s) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    teacher = Teacher().requires_grad_(False)
    student = Student()
    g = torch.Generator().manual_seed(2)
    xv = torch.randn(2048, D_IN, generator=g)
    tv = teacher(xv)
    opt = torch.optim.Adam(student.parameters(), lr=LR)
    losses, kl1, gnorms = [], [], []

    def val():
        with torch.no_grad():
            s = student(xv)
            agree = (s.argmax(1) == tv.argmax(1)).float().mean().item()
            return round(agree, 3), round(kd_loss(s, tv, 1.0).item(), 4)

    with Recorder(args.run_dir, model=student, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            temp = T_BEFORE if step < T_STEP else T_AFTER
            x = torch.randn(BATCH, D_IN, generator=g)
            with torch.no_grad():
                t = teacher(x)
            s = student(x)
            loss = kd_loss(s, t, temp)
            with torch.no_grad():
                k1 = kd_loss(s, t, 1.0).item()
            opt.zero_grad()
            loss.backward()
            gn = math.sqrt(sum(p.grad.pow(2).sum().item() for p in student.parameters()))
            opt.step()
            rec.step(loss=loss, kl_at_t1=k1, temperature=temp)
            losses.append(loss.item())
            kl1.append(k1)
            gnorms.append(gn)
            if step % 30 == 0 or T_STEP - 1 <= step <= T_STEP + 1 or step == STEPS - 1:
                print(f"step {step} T {temp} loss {loss.item():.4f} kl@T1 {k1:.4f} "
                      f"gn {gn:.4f} val(agree, kl@T1) {val()}", flush=True)
    w = 20
    for name, v in (("loss", losses), ("kl@T1", kl1), ("gnorm", gnorms)):
        print(name, "20-step window medians",
              [round(med(v[i:i + w]), 4) for i in range(0, STEPS, w)])
    print("gnorm median 100-199", round(med(gnorms[100:T_STEP]), 4), "median 200-419",
          round(med(gnorms[T_STEP:]), 4), "max", round(max(gnorms), 3), "at",
          gnorms.index(max(gnorms)), "nonfinite", sum(not math.isfinite(v) for v in losses))


if __name__ == "__main__":
    main()
