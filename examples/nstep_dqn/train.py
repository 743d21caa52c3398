"""An n-step DQN on CartPole whose replay is an rlreplay episode table.

The collector appends each episode's steps as they happen (``append_steps``, a few steps at a
time) and ends the episode as Gymnasium does: ``terminated`` when the pole falls, ``truncated``
at the time limit, with the last observation as ``final``. The learner samples n-step
transitions that the server builds (``length=1, n_step=3, next_fields=["obs"]``): ``returns``
is the discounted sum of the next n' rewards, ``discount`` is gamma^n' or 0 where the episode
terminated, and ``next["obs"]`` is the observation to bootstrap from. The target is then
``returns + discount * max_a Q_target(next_obs, a)`` with no episode bookkeeping in the client.

``python examples/nstep_dqn/train.py --url http://127.0.0.1:8000`` with a server running
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

TABLE = "cartpole_nstep"


def q_network(obs_dim: int, actions: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(obs_dim, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, actions)
    )


class EpisodeAppender:
    """Keeps the steps of the running episode that are not sent yet and appends them to the
    table every ``every`` steps and at the episode's end (``start`` counts what was sent)."""

    def __init__(self, client: Any, table: str, every: int) -> None:
        self.client, self.table, self.every = client, table, every
        self.episode, self.episodes, self.sent = "", 0, 0
        self.pending: dict[str, list[Any]] = {"obs": [], "action": [], "reward": []}

    def begin(self) -> None:
        self.episode, self.episodes, self.sent = f"ep-{self.episodes}", self.episodes + 1, 0

    def step(self, obs: np.ndarray, action: int, reward: float) -> None:
        self.pending["obs"].append(obs)
        self.pending["action"].append(action)
        self.pending["reward"].append(reward)
        if len(self.pending["obs"]) >= self.every:
            self.flush()

    def flush(self, end: str | None = None, final: dict[str, np.ndarray] | None = None) -> None:
        steps = {
            "obs": np.asarray(self.pending["obs"], dtype=np.float32).reshape(-1, 4),
            "action": np.asarray(self.pending["action"], dtype=np.int64),
            "reward": np.asarray(self.pending["reward"], dtype=np.float32),
        }
        k = len(steps["action"])
        if k or end:
            self.client.append_steps(
                self.table, self.episode, steps, start=self.sent, end=end, final=final
            )
        self.sent += k
        for column in self.pending.values():
            column.clear()


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
    q = q_network(4, 2)
    target = copy.deepcopy(q)
    optimizer = torch.optim.Adam(q.parameters(), lr=args.lr)
    client.create_table(TABLE, sampler={"type": "uniform"}, max_size=args.replay_size, episodes={})
    appender = EpisodeAppender(client, TABLE, args.append_every)
    returns: list[float] = []
    obs, _ = env.reset(seed=args.seed)
    appender.begin()
    episode_return, updates, started = 0.0, 0, time.monotonic()
    for step in range(args.env_steps):
        epsilon = max(args.epsilon_end, 1.0 - step / args.epsilon_steps)
        if rng.random() < epsilon:
            action = int(rng.integers(2))
        else:
            with torch.no_grad():
                action = int(q(torch.as_tensor(obs)).argmax())
        next_obs, reward, terminated, truncated, _ = env.step(action)
        appender.step(obs, action, float(reward))
        episode_return += float(reward)
        obs = next_obs
        if terminated or truncated:
            # reward[t] is what step t's action earned; `final` is the observation after the
            # last step: a truncated episode bootstraps from it, a terminated one does not.
            appender.flush("terminated" if terminated else "truncated", {"obs": obs})
            returns.append(episode_return)
            if args.log_every and len(returns) % args.log_every == 0:
                print(
                    f"step {step + 1:6d} episodes {len(returns):4d} "
                    f"mean return (last 20) {np.mean(returns[-20:]):6.1f}",
                    flush=True,
                )
            obs, _ = env.reset()
            appender.begin()
            episode_return = 0.0
        if step >= args.learning_starts and step % args.train_every == 0:
            learn(client, q, target, optimizer, args)
            updates += 1
            if updates % args.target_every == 0:
                target.load_state_dict(q.state_dict())
    client.drop_table(TABLE)
    baseline = random_returns(20, args.seed)
    return {
        "env_steps": args.env_steps,
        "episodes": len(returns),
        "updates": updates,
        "mean_return_last20": float(np.mean(returns[-20:])),
        "random_mean_return": float(np.mean(baseline)),
        "seconds": round(time.monotonic() - started, 1),
    }


def learn(
    client: Any,
    q: nn.Module,
    target: nn.Module,
    optimizer: torch.optim.Optimizer,
    args: argparse.Namespace,
) -> None:
    """One gradient step on a batch of n-step transitions built by the server."""
    batch = client.sample(
        TABLE,
        args.batch_size,
        length=1,
        n_step=args.n_step,
        gamma=args.gamma,
        fields=["obs", "action"],
        next_fields=["obs"],
    )
    # Windows of one step: [B, 1, ...] -> [B, ...].
    obs = torch.as_tensor(batch.columns["obs"][:, 0])
    action = torch.as_tensor(batch.columns["action"][:, 0])
    ret = torch.as_tensor(batch.returns[:, 0], dtype=torch.float32)
    discount = torch.as_tensor(batch.discount[:, 0], dtype=torch.float32)
    next_obs = torch.as_tensor(batch.next["obs"][:, 0])
    with torch.no_grad():
        # Double DQN: the online net picks the action, the target net values it.
        best = q(next_obs).argmax(dim=1, keepdim=True)
        y = ret + discount * target(next_obs).gather(1, best).squeeze(1)
    value = q(obs).gather(1, action.unsqueeze(1)).squeeze(1)
    loss = nn.functional.smooth_l1_loss(value, y)
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(q.parameters(), 10.0)
    optimizer.step()


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--env-steps", type=int, default=30_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-step", type=int, default=3)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--replay-size", type=int, default=50_000)
    p.add_argument("--learning-starts", type=int, default=1_000)
    p.add_argument("--train-every", type=int, default=1)
    p.add_argument("--target-every", type=int, default=500, help="updates between target syncs")
    p.add_argument("--epsilon-steps", type=int, default=10_000)
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
