"""A Gymnasium vector env collecting into an rlreplay episode table, and a learner sampling it.

The collector steps ``--envs`` CartPole environments at once (``gymnasium.vector``, reset
in the same step an episode ends) with a fixed behaviour policy (push the cart the way the
pole falls, a random action with probability ``--epsilon``), and appends each environment's
steps to its running episode through the synchronous client's pipelined episode writer,
ending it as Gymnasium says (``terminated`` or ``truncated``, the last observation as
``final``). A learner thread, sharing the client, samples 3-step transitions that the server
builds (``n_step=3, next_fields=["obs"]``) and fits a linear state-value function of that
policy by TD(3): ``V(s) <- returns + discount * V(s')``, where ``discount`` is 0 past a
terminated episode's end.

Needs gymnasium and numpy (no torch). Prints a progress line now and then and, last, one
JSON line: steps, episodes, what the table holds, the learner's updates and its mean
absolute TD error over its first and its last 50 batches.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from typing import Any

import gymnasium as gym
import numpy as np

import rlreplay

TABLE = "gym_episodes"
N_STEP = 3
GAMMA = 0.9


def features(obs: np.ndarray) -> np.ndarray:
    """A linear Q-function's features of a batch of observations: the observation, its
    squares and a bias."""
    return np.concatenate([obs, obs * obs, np.ones((*obs.shape[:-1], 1))], axis=-1)


def behaviour(obs: np.ndarray, rng: np.random.Generator, epsilon: float) -> np.ndarray:
    """Push the cart the way the pole falls (angle plus angular velocity); a random action
    with probability ``epsilon``."""
    lean = (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)
    explore = rng.random(len(obs)) < epsilon
    return np.where(explore, rng.integers(0, 2, len(obs)), lean)


class Learner(threading.Thread):
    """Samples n-step transitions and fits ``V(s) = w . features(s)`` by TD(n)."""

    def __init__(self, client: rlreplay.Client, args: argparse.Namespace) -> None:
        super().__init__(name="learner", daemon=True)
        self.client, self.args = client, args
        self.weights = np.zeros(9)
        self.errors: list[float] = []
        self.updates = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                if self.client.describe_table(TABLE)["stats"]["size"] < self.args.batch_size:
                    time.sleep(0.05)
                    continue
                self.update()
        except BaseException as exc:  # shown by the main thread
            self.error = exc

    def update(self) -> None:
        batch = self.client.sample(
            TABLE, self.args.batch_size, length=1, n_step=N_STEP, gamma=GAMMA, next_fields=["obs"]
        )
        assert batch.returns is not None and batch.discount is not None
        phi, phi_next = features(batch["obs"][:, 0]), features(batch.next["obs"][:, 0])
        target = batch.returns[:, 0] + batch.discount[:, 0] * (phi_next @ self.weights)
        error = target - phi @ self.weights
        self.weights = self.weights + self.args.lr * (error[:, None] * phi).mean(axis=0)
        self.errors.append(float(np.abs(error).mean()))
        self.updates += 1


def collect(client: rlreplay.Client, args: argparse.Namespace) -> dict[str, Any]:
    """Steps the vector env ``args.env_steps`` times while the learner learns; the figures."""
    rng = np.random.default_rng(args.seed)
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1") for _ in range(args.envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    client.create_table(TABLE, sampler={"type": "uniform"}, max_size=args.replay_size, episodes={})
    learner = Learner(client, args)
    learner.start()
    episodes = [uuid.uuid4().hex for _ in range(args.envs)]
    pending: list[dict[str, list[Any]]] = [
        {"obs": [], "action": [], "reward": []} for _ in episodes
    ]
    returns, running = [], np.zeros(args.envs)
    obs, _ = envs.reset(seed=args.seed)
    with client.episode_writer(TABLE, max_in_flight=8) as writer:
        for step in range(args.env_steps):
            actions = behaviour(obs, rng, args.epsilon)
            next_obs, rewards, terminated, truncated, infos = envs.step(actions)
            running += rewards
            for i in range(args.envs):
                for name, value in (
                    ("obs", obs[i]),
                    ("action", actions[i]),
                    ("reward", rewards[i]),
                ):
                    pending[i][name].append(value)
                ended = terminated[i] or truncated[i]
                if ended or len(pending[i]["obs"]) >= args.append_every:
                    writer.append(episodes[i], {k: np.stack(v) for k, v in pending[i].items()})
                    pending[i] = {"obs": [], "action": [], "reward": []}
                if ended:
                    # with same-step autoreset, next_obs is already the new episode's first
                    # observation; the last one of the old episode is in infos["final_obs"]
                    final = {"obs": np.asarray(infos["final_obs"][i], dtype=np.float32)}
                    writer.end(
                        episodes[i], "terminated" if terminated[i] else "truncated", final=final
                    )
                    episodes[i] = uuid.uuid4().hex
                    returns.append(float(running[i]))
                    running[i] = 0.0
            obs = next_obs
            if learner.error is not None:
                raise learner.error
            if args.log_every and (step + 1) % args.log_every == 0:
                print(
                    f"step {step + 1:6d} episodes {len(returns):4d} updates {learner.updates:5d} "
                    f"mean return (last 20) {np.mean(returns[-20:] or [0.0]):6.1f}",
                    flush=True,
                )
        writer.flush()
    learner.stop.set()
    learner.join(timeout=60)
    if learner.error is not None:
        raise learner.error
    envs.close()
    stats = client.describe_table(TABLE)["stats"]
    return {
        "env_steps": args.env_steps * args.envs,
        "episodes": len(returns),
        "table_size": int(stats["size"]),
        "learner_updates": learner.updates,
        "mean_return_last_20": float(np.mean(returns[-20:])) if returns else 0.0,
        "td_error_first_50": float(np.mean(learner.errors[:50])) if learner.errors else None,
        "td_error_last_50": float(np.mean(learner.errors[-50:])) if learner.errors else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the replay server")
    parser.add_argument("--envs", type=int, default=8, help="environments in the vector env")
    parser.add_argument("--env-steps", type=int, default=2_000, help="vector env steps")
    parser.add_argument("--append-every", type=int, default=16, help="steps per append")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--replay-size", type=int, default=50_000, help="the table's max_size")
    parser.add_argument("--epsilon", type=float, default=0.2, help="random actions' share")
    parser.add_argument("--lr", type=float, default=0.05, help="the learner's step size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=500, help="0: no progress lines")
    parser.add_argument("--keep-table", action="store_true", help="leave the table behind")
    args = parser.parse_args()
    with rlreplay.Client(args.url) as client:
        try:
            result = collect(client, args)
        finally:
            if not args.keep_table:
                client.drop_table(TABLE)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
