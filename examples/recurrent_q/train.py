"""A recurrent Q-learner with burn-in (R2D2's recipe) on CartPole with the velocities hidden.

The agent sees only the cart's position and the pole's angle, so it must keep the velocities
in a recurrent state (a GRU). The collector appends each step with the state the GRU had
before it (``h``); the learner samples windows of ``burn_in + length`` steps that start where
``start_every`` allows, starts the GRU from the stored ``h`` of the window's first step, runs
the burn-in steps without gradient to refresh that stale state, and learns on the ``length``
steps after them. The server pads windows that run past an episode's end (``pad=True``,
``mask`` false there) and adds n-step ``returns`` and ``discount`` for each step, so the
target of step t is ``returns[t] + discount[t] * Q_target(t + n')``, taken from the same
unroll; ``discount`` is 0 where the episode terminated. Priorities are set per window start
from the TD errors of its steps with R2D2's mix η·max + (1 - η)·mean.

``python examples/recurrent_q/train.py --url http://127.0.0.1:8000`` with a server running
(``rlreplay serve``) and torch and gymnasium installed. The last line it prints is JSON: the
mean return of the last 20 episodes, next to a random policy's on the same seeds.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import rlreplay

TABLE = "cartpole_hidden_velocity"
SEEN = [0, 2]  # cart position and pole angle; the two velocities are hidden


class RecurrentQ(nn.Module):
    """Observation -> MLP -> GRU -> Q values, one step or a whole window at a time."""

    def __init__(self, obs_dim: int, actions: int, hidden: int) -> None:
        super().__init__()
        self.encode = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU())
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, actions))

    def forward(self, obs: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``obs`` [B, W, obs_dim] and ``h`` [B, hidden] -> Q [B, W, actions] and the last h."""
        out, last = self.gru(self.encode(obs), h.unsqueeze(0))
        return self.head(out), last.squeeze(0)


def unroll(
    net: RecurrentQ, obs: torch.Tensor, h0: torch.Tensor, burn_in: int, grad: bool
) -> torch.Tensor:
    """Q over a window: the burn-in steps without gradient from the stored state, then the
    rest (with gradient when ``grad``); [B, W, actions]."""
    with torch.no_grad():
        q_burn, h = net(obs[:, :burn_in], h0) if burn_in else (obs[:, :0, :0], h0)
    with torch.set_grad_enabled(grad):
        q_rest, _ = net(obs[:, burn_in:], h)
    if not burn_in:
        return q_rest
    return torch.cat([q_burn.detach(), q_rest], dim=1)


def random_returns(episodes: int, seed: int) -> list[float]:
    """What a uniformly random policy scores on the same environment seeds."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    out = []
    for i in range(episodes):
        env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(int(rng.integers(2)))
            total += float(reward)
            done = terminated or truncated
        out.append(total)
    return out


def train(client: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Collects ``args.env_steps`` steps into the table and learns from it; the returns."""
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    env = gym.make("CartPole-v1")
    q = RecurrentQ(len(SEEN), 2, args.hidden)
    target = copy.deepcopy(q)
    optimizer = torch.optim.Adam(q.parameters(), lr=args.lr)
    client.create_table(
        TABLE,
        sampler={"type": "prioritized", "exponent": 0.6},
        max_size=args.replay_size,
        episodes={},
    )
    returns: list[float] = []
    updates, started = 0, time.monotonic()
    step = 0
    while step < args.env_steps:
        obs, _ = env.reset(seed=args.seed if not returns else None)
        episode, sent, total, done = f"{args.seed}-{len(returns)}", 0, 0.0, False
        h = torch.zeros(1, args.hidden)
        pending: dict[str, list[Any]] = {"obs": [], "h": [], "action": [], "reward": []}
        while not done:
            epsilon = max(args.epsilon_end, 1.0 - step / args.epsilon_steps)
            seen = obs[SEEN].astype(np.float32)
            with torch.no_grad():
                values, h_next = q(torch.as_tensor(seen).view(1, 1, -1), h)
            action = int(rng.integers(2)) if rng.random() < epsilon else int(values.argmax())
            obs, reward, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
            # Each step carries the state the GRU had before it: a window starting there can
            # start its unroll from it.
            for name, value in (("obs", seen), ("h", h[0].numpy()), ("action", action)):
                pending[name].append(value)
            pending["reward"].append(float(reward))
            h, total, step = h_next, total + float(reward), step + 1
            if done or len(pending["obs"]) == args.append_every:
                steps = {
                    "obs": np.stack(pending["obs"]),
                    "h": np.stack(pending["h"]).astype(np.float32),
                    "action": np.asarray(pending["action"], dtype=np.int64),
                    "reward": np.asarray(pending["reward"], dtype=np.float32),
                }
                end = ("terminated" if terminated else "truncated") if done else None
                final = {"obs": obs[SEEN].astype(np.float32)} if done else None
                client.append_steps(TABLE, episode, steps, start=sent, end=end, final=final)
                sent += len(steps["action"])
                for column in pending.values():
                    column.clear()
            if step >= args.learning_starts and step % args.train_every == 0:
                learn(client, q, target, optimizer, args)
                updates += 1
                if updates % args.target_every == 0:
                    target.load_state_dict(q.state_dict())
        returns.append(total)
        if args.log_every and len(returns) % args.log_every == 0:
            print(
                f"step {step:6d} episodes {len(returns):4d} "
                f"mean return (last 20) {np.mean(returns[-20:]):6.1f}",
                flush=True,
            )
    client.drop_table(TABLE)
    baseline = random_returns(20, args.seed)
    return {
        "env_steps": step,
        "episodes": len(returns),
        "updates": updates,
        "mean_return_last20": float(np.mean(returns[-20:])),
        "random_mean_return": float(np.mean(baseline)),
        "seconds": round(time.monotonic() - started, 1),
    }


def learn(
    client: Any,
    q: RecurrentQ,
    target: RecurrentQ,
    optimizer: torch.optim.Optimizer,
    args: argparse.Namespace,
) -> None:
    """One gradient step on a batch of windows, then their starts' new priorities."""
    n, gamma, burn_in = args.n_step, args.gamma, args.burn_in
    batch = client.sample(
        TABLE,
        args.batch_size,
        length=args.length,
        burn_in=burn_in,
        start_every=args.start_every,
        pad=True,
        n_step=n,
        gamma=gamma,
        fields=["obs", "h", "action"],
    )
    obs = torch.as_tensor(batch.columns["obs"])
    h0 = torch.as_tensor(batch.columns["h"][:, 0])
    action = torch.as_tensor(batch.columns["action"])
    mask = torch.as_tensor(batch.mask)
    ret = torch.as_tensor(batch.returns, dtype=torch.float32)
    discount = torch.as_tensor(batch.discount, dtype=torch.float32)
    width = obs.shape[1]
    # n' (the steps the return sums) is where discount = gamma^n'; 0 where it is 0 (terminated).
    powers = torch.tensor([gamma**k for k in range(1, n + 1)], dtype=torch.float32)
    ahead = torch.where(discount > 0, (discount.unsqueeze(-1) - powers).abs().argmin(-1) + 1, 0)
    at = torch.arange(width).expand_as(ahead) + ahead
    inside = at < width
    at = at.clamp(max=width - 1)
    # A step is learned from when it is stored, after the burn-in, and either does not
    # bootstrap or bootstraps from a stored step of the same window.
    learned = mask.clone()
    learned[:, :burn_in] = False
    learned &= (discount == 0) | (inside & mask.gather(1, at))

    q_all = unroll(q, obs, h0, burn_in, grad=True)
    with torch.no_grad():
        q_target = unroll(target, obs, h0, burn_in, grad=False)
        best = q_all.detach().gather(1, at.unsqueeze(-1).expand(-1, -1, 2)).argmax(-1)
        bootstrap = q_target.gather(1, at.unsqueeze(-1).expand(-1, -1, 2))
        bootstrap = bootstrap.gather(2, best.unsqueeze(-1)).squeeze(-1)
        y = ret + discount * bootstrap
    value = q_all.gather(2, action.unsqueeze(-1)).squeeze(-1)
    td = torch.where(learned, value - y, torch.zeros_like(y))
    weights = torch.as_tensor(batch.weights, dtype=torch.float32).unsqueeze(1)
    loss = (weights * nn.functional.smooth_l1_loss(value, y, reduction="none") * learned).sum()
    loss = loss / learned.sum().clamp(min=1)
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(q.parameters(), 10.0)
    optimizer.step()
    # R2D2: a window start's priority mixes the largest and the mean |δ| of its learned steps.
    errors = td[:, burn_in:].abs().detach().numpy()
    learned_steps = learned[:, burn_in:].numpy()
    client.update_window_priorities(
        TABLE,
        [
            (episode, int(start), errors[i][learned_steps[i]] if learned_steps[i].any() else [0.0])
            for i, (episode, start) in enumerate(zip(batch.episodes, batch.starts, strict=True))
        ],
        eta=0.9,
    )


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--env-steps", type=int, default=40_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--burn-in", type=int, default=8)
    p.add_argument("--length", type=int, default=16)
    p.add_argument("--start-every", type=int, default=8)
    p.add_argument("--n-step", type=int, default=3)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--replay-size", type=int, default=50_000)
    p.add_argument("--learning-starts", type=int, default=1_000)
    p.add_argument("--train-every", type=int, default=4)
    p.add_argument("--target-every", type=int, default=250, help="updates between target syncs")
    p.add_argument("--epsilon-steps", type=int, default=15_000)
    p.add_argument("--epsilon-end", type=float, default=0.02)
    p.add_argument("--append-every", type=int, default=8, help="steps per append")
    p.add_argument("--log-every", type=int, default=20, help="episodes between lines; 0: none")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    torch.set_num_threads(1)
    with rlreplay.Client(args.url) as client:
        print(json.dumps(train(client, args)))


if __name__ == "__main__":
    main()
