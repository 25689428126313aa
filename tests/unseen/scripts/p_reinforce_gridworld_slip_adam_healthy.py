"""Healthy: REINFORCE (score-function policy gradient with a running-mean baseline) on a
slippery 6x6 gridworld; the recorded loss is the batch's mean episode cost, high-variance.

What it does: 8 episodes per update, run in parallel. The agent starts at (0,0); the goal
is (5,5); 4 actions; with probability 0.3 the action is replaced by a random one (slip);
at most 25 moves. Episode cost = (moves used + 2 * Manhattan distance left at the end) / 35,
in [~0.29, 1.57]. Policy: MLP(one-hot cell 36 -> 64 -> ReLU -> 4 logits). The loss is the
"magic box" surrogate: mean(cost) + mean((cost - baseline) * (logp - logp.detach())),
whose VALUE is exactly the batch's mean cost and whose gradient is the REINFORCE estimate
(baseline: exponential moving average of past costs, 0.9). 350 updates, Adam(lr 3e-3),
constant LR. The 8-episode mean cost is noisy because the slips and the sampled actions are.

What is TRUE of the run (measured; WINDOW_MEANS printed at the end):
- 35-update window means of the loss (= mean episode cost): 0.989, 0.76, 0.532, 0.467,
  0.467, 0.44, 0.437, 0.41, 0.404, 0.416. Per-update loss 0.329-1.129.
- Share of episodes reaching the goal, same windows: 0.075, 0.393, 0.829, 0.943, 0.946,
  0.979, 0.986, 0.975, 0.996, 0.986.
- LR constant 3e-3. The last windows are flat within noise (0.404 vs 0.416). Healthy.
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, EPISODES, SIDE, MAX_MOVES, SLIP = 350, 8, 6, 25, 0.3
MOVES = torch.tensor([[0, 1], [1, 0], [0, -1], [-1, 0]])


def window_means(losses, k=10):
    n = len(losses) // k
    return [round(sum(losses[i * n:(i + 1) * n]) / n, 3) for i in range(k)]


def rollout(policy, gen):
    pos = torch.zeros(EPISODES, 2, dtype=torch.long)
    done = torch.zeros(EPISODES, dtype=torch.bool)
    moves = torch.zeros(EPISODES)
    logp = torch.zeros(EPISODES)
    for _ in range(MAX_MOVES):
        cell = pos[:, 0] * SIDE + pos[:, 1]
        logits = policy(nn.functional.one_hot(cell, SIDE * SIDE).float())
        dist = torch.distributions.Categorical(logits=logits)
        a = torch.multinomial(dist.probs.detach(), 1, generator=gen).squeeze(1)
        logp = logp + torch.where(done, torch.zeros(()), dist.log_prob(a))
        slip = torch.rand(EPISODES, generator=gen) < SLIP
        a_eff = torch.where(slip, torch.randint(0, 4, (EPISODES,), generator=gen), a)
        new = (pos + MOVES[a_eff]).clamp(0, SIDE - 1)
        pos = torch.where(done.unsqueeze(1), pos, new)
        moves = moves + (~done).float()
        done = done | ((pos[:, 0] == SIDE - 1) & (pos[:, 1] == SIDE - 1))
        if done.all():
            break
    left = (SIDE - 1 - pos).sum(1).float()
    cost = (moves + 2 * left) / 35
    return cost, logp, done.float().mean()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(4)
    policy = nn.Sequential(nn.Linear(SIDE * SIDE, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    baseline = None
    losses, success = [], []
    with Recorder(args.run_dir, model=policy, optimizer=opt, preset="standard") as rec:
        for _ in range(STEPS):
            cost, logp, reached = rollout(policy, gen)
            b = cost.mean().item() if baseline is None else baseline
            loss = cost.mean() + ((cost - b) * (logp - logp.detach())).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            rec.step(loss=loss, success=reached)
            baseline = cost.mean().item() if baseline is None else \
                0.9 * baseline + 0.1 * cost.mean().item()
            losses.append(loss.item())
            success.append(reached.item())
    print("WINDOW_MEANS", window_means(losses))
    print("SUCCESS_WINDOWS", window_means(success))
    print("min/max", round(min(losses), 3), round(max(losses), 3))


if __name__ == "__main__":
    main()
