"""PPO on CartPole: the recorded loss and gradient norm grow while the agent gets ~12x better.

What it does: CartPole-v1 (gym's dynamics, written out and vectorised over 8 envs, 500-step
cap) solved with PPO as in CleanRL's ppo.py: separate 64-64 tanh actor and critic with
orthogonal init, rollouts of 128 steps x 8 envs, GAE (gamma 0.99, lambda 0.95), 4 epochs x 4
minibatches of 256 per rollout (16 optimizer steps each), clipped surrogate (0.2),
per-minibatch advantage normalisation, entropy bonus 0.01, value coefficient 0.5 without
value clipping and without return normalisation, Adam lr 1e-3 (eps 1e-5) annealed linearly
per rollout to 4e-5, gradients clipped to norm 0.5. 25 rollouts = 400 recorded optimizer
steps; loss = policy + 0.5 value - 0.01 entropy, with the parts and the running episode
length as metrics. Standard preset. Seeded, deterministic.

What is TRUE of the run (measured):
- The agent learns: mean length of the last 20 episodes 21.9 after rollout 0, 41.5 (3),
  80.0 (6), 102 (9), 150 (11), 197 (13), 207 (16), 219 (20), 271 (24, the last).
- The recorded loss is the value error, which grows with the returns: 50-step medians 22.5,
  27.7, 30.3, 31.2, 30.8, 30.2, 30.9, 31.9 (value part 45.0 -> 63.7; policy part |pg| <
  0.008; entropy 0.677 -> 0.559). So the loss rises 40% in the first 150 steps, then stays
  flat, while the agent improves all along. Within a window single steps range over up to
  1.8x (min to max).
- The pre-clip gradient norm (what clip_grad_norm_ returns, and what the recorder records)
  rises with the value targets: 50-step medians 11.8, 30.9, 40.3, 41.4, 39.7, 37.6, 38.6,
  39.7, max 51.4; every step is clipped to 0.5, so the updates stay bounded. No NaN/Inf.
- Step time: the first optimizer step of each rollout also collects the rollout (median
  86 ms, max 155 ms, every 16th step) against 3 ms for the others; 64% of the recorded time.
  ~8 s in all on 2 CPU cores.
- Healthy: a growing unnormalised value loss and gradient norm are what PPO looks like
  while episodes lengthen; clipping bounds the steps and the policy keeps improving.
"""

import argparse
import math

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
    "forbidden": ["loss_divergence", "gradient_explosion", "loss_plateau", "loss_spike",
                  "step_time_outlier", "dataloader_bottleneck"],
}

N_ENVS, N_STEPS, EPOCHS, MINIBATCHES, ROLLOUTS = 8, 128, 4, 4, 25
GAMMA, LAMBDA, CLIP, ENT, VF, MAX_GRAD, LR = 0.99, 0.95, 0.2, 0.01, 0.5, 0.5, 1e-3


class CartPole:
    """gym's CartPole-v1 dynamics (Barto, Sutton & Anderson 1983), vectorised over envs:
    +1 reward per step, done when |x| > 2.4, |theta| > 12 degrees or after 500 steps."""

    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02

    def __init__(self, n: int, g: torch.Generator) -> None:
        self.n, self.g = n, g
        self.state = torch.zeros(n, 4)
        self.t = torch.zeros(n, dtype=torch.long)
        self.reset(torch.ones(n, dtype=torch.bool))

    def reset(self, mask: torch.Tensor) -> None:
        k = int(mask.sum())
        if k:
            self.state[mask] = torch.rand(k, 4, generator=self.g) * 0.1 - 0.05
            self.t[mask] = 0

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, x_dot, th, th_dot = self.state.unbind(1)
        force = torch.where(action == 1, self.force_mag, -self.force_mag)
        total = self.masspole + self.masscart
        pml = self.masspole * self.length
        cos, sin = torch.cos(th), torch.sin(th)
        temp = (force + pml * th_dot ** 2 * sin) / total
        th_acc = (self.gravity * sin - cos * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * cos ** 2 / total))
        x_acc = temp - pml * th_acc * cos / total
        x, x_dot = x + self.tau * x_dot, x_dot + self.tau * x_acc
        th, th_dot = th + self.tau * th_dot, th_dot + self.tau * th_acc
        self.state = torch.stack([x, x_dot, th, th_dot], 1)
        self.t += 1
        fell = (x.abs() > 2.4) | (th.abs() > 12 * 2 * math.pi / 360)
        done = fell | (self.t >= 500)
        reward = torch.ones(self.n)
        return reward, done, fell


def layer(i: int, o: int, std: float = math.sqrt(2)) -> nn.Linear:
    lin = nn.Linear(i, o)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.zeros_(lin.bias)
    return lin


class ActorCritic(nn.Module):
    """CleanRL's ppo.py agent: separate 64-64 tanh MLPs for the value and the policy."""

    def __init__(self) -> None:
        super().__init__()
        self.critic = nn.Sequential(layer(4, 64), nn.Tanh(), layer(64, 64), nn.Tanh(),
                                    layer(64, 1, 1.0))
        self.actor = nn.Sequential(layer(4, 64), nn.Tanh(), layer(64, 64), nn.Tanh(),
                                   layer(64, 2, 0.01))

    def value(self, s: torch.Tensor) -> torch.Tensor:
        return self.critic(s).squeeze(-1)

    def dist(self, s: torch.Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self.actor(s))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    env_g = torch.Generator().manual_seed(1)
    env = CartPole(N_ENVS, env_g)
    agent = ActorCritic()
    opt = torch.optim.Adam(agent.parameters(), lr=LR, eps=1e-5)

    ep_len = torch.zeros(N_ENVS)
    finished: list[float] = []
    log: list[tuple[int, float, float, float, float, float]] = []
    step = 0
    with Recorder(args.run_dir, model=agent, optimizer=opt, preset="standard") as rec:
        for rollout in range(ROLLOUTS):
            opt.param_groups[0]["lr"] = LR * (1 - rollout / ROLLOUTS)   # CleanRL's anneal
            obs = torch.zeros(N_STEPS, N_ENVS, 4)
            acts = torch.zeros(N_STEPS, N_ENVS, dtype=torch.long)
            logps = torch.zeros(N_STEPS, N_ENVS)
            rews = torch.zeros(N_STEPS, N_ENVS)
            dones = torch.zeros(N_STEPS, N_ENVS)
            vals = torch.zeros(N_STEPS, N_ENVS)
            with torch.no_grad():
                for t in range(N_STEPS):
                    s = env.state.clone()
                    d = agent.dist(s)
                    a = d.sample()
                    obs[t], acts[t], logps[t], vals[t] = s, a, d.log_prob(a), agent.value(s)
                    r, done, _ = env.step(a)
                    rews[t], dones[t] = r, done.float()
                    ep_len += 1
                    for i in torch.nonzero(done).flatten().tolist():
                        finished.append(float(ep_len[i]))
                        ep_len[i] = 0
                    env.reset(done)
                next_v = agent.value(env.state)
                # GAE(lambda)
                adv = torch.zeros(N_STEPS, N_ENVS)
                last = torch.zeros(N_ENVS)
                for t in reversed(range(N_STEPS)):
                    nv = next_v if t == N_STEPS - 1 else vals[t + 1]
                    nonterm = 1.0 - dones[t]
                    delta = rews[t] + GAMMA * nv * nonterm - vals[t]
                    last = delta + GAMMA * LAMBDA * nonterm * last
                    adv[t] = last
                ret = adv + vals
            b_obs, b_act, b_logp = obs.flatten(0, 1), acts.flatten(), logps.flatten()
            b_adv, b_ret = adv.flatten(), ret.flatten()
            mean_len = sum(finished[-20:]) / max(1, len(finished[-20:]))
            n = N_STEPS * N_ENVS
            mb = n // MINIBATCHES
            for _ in range(EPOCHS):
                perm = torch.randperm(n)
                for k in range(MINIBATCHES):
                    idx = perm[k * mb:(k + 1) * mb]
                    d = agent.dist(b_obs[idx])
                    ratio = (d.log_prob(b_act[idx]) - b_logp[idx]).exp()
                    a_n = b_adv[idx]
                    a_n = (a_n - a_n.mean()) / (a_n.std() + 1e-8)
                    pg_loss = torch.max(-a_n * ratio,
                                        -a_n * ratio.clamp(1 - CLIP, 1 + CLIP)).mean()
                    v = agent.value(b_obs[idx])
                    # no value clipping (Andrychowicz et al. 2021 found it hurts)
                    v_loss = 0.5 * ((v - b_ret[idx]) ** 2).mean()
                    entropy = d.entropy().mean()
                    loss = pg_loss - ENT * entropy + VF * v_loss
                    opt.zero_grad()
                    loss.backward()
                    pre_clip = nn.utils.clip_grad_norm_(agent.parameters(), MAX_GRAD)
                    opt.step()
                    rec.step(loss=loss, policy_loss=pg_loss, value_loss=v_loss,
                             entropy=entropy, episode_length=mean_len)
                    log.append((step, loss.item(), pg_loss.item(), v_loss.item(),
                                entropy.item(), float(pre_clip)))
                    step += 1
            print(f"rollout {rollout:2d} (steps {step - 16}-{step - 1}): mean length of last "
                  f"20 episodes {mean_len:6.1f}  episodes {len(finished)}  "
                  f"mean return target {b_ret.mean():.2f}")
    for s in range(0, step, 50):
        w = log[s:s + 50]
        def med(j: int, w: list = w) -> float:
            return sorted(r[j] for r in w)[len(w) // 2]

        print(f"steps {s:3d}-{s + len(w) - 1:3d}: loss median {med(1):7.3f} "
              f"[{min(r[1] for r in w):.3f}, {max(r[1] for r in w):.3f}]  pg {med(2):+.4f}  "
              f"value {med(3):7.3f}  entropy {med(4):.3f}  grad norm (pre-clip) median "
              f"{med(5):.3f} max {max(r[5] for r in w):.3f}")


if __name__ == "__main__":
    main()
