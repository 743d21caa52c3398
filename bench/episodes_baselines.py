"""The baselines of the episodes benchmark: DeepMind Reverb and TorchRL on the same steps.

Both serve what :mod:`bench.episodes` asks of rlreplay: windows of ``[64, 80]`` steps of
84x84 uint8 frames and n-step transitions of ``[256]``, from the same episodes
(:func:`episode_frames`). This module imports nothing of the project and only NumPy at the
top, so that it runs in Reverb's venv (TensorFlow 2.15 pins Python 3.11 and its own
packages) and in TorchRL's: ``python -m bench.episodes_baselines reverb|torchrl STEPS
SECONDS`` prints one JSON object.

* Reverb 0.14: a server in a process of its own, and one client process that writes every
  episode through ``trajectory_writer`` (an item per window start, as Acme's sequence adder
  with period 1 makes them, and an item per n-step transition that references the step
  ``n`` before and the ``n`` rewards between) and then reads through ``TrajectoryDataset``
  batched by 64 windows or 256 transitions.
* TorchRL: in process, a ``TensorDictReplayBuffer`` over a ``LazyTensorStorage`` with a
  ``SliceSampler(slice_len=80, traj_key="episode", cache_values=True)`` for windows (the
  data does not change while it samples, which is what ``cache_values`` needs), and a
  ``RandomSampler`` over transitions whose n-step fields and next frame are stored with each
  step, as TorchRL's ``MultiStep`` post-processing writes them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

FRAME = (84, 84)
EPISODE_STEPS = 500
WINDOW_BATCH, WINDOW = 64, 80
NSTEP_BATCH, N_STEP, GAMMA = 256, 3, 0.99
ROOT = Path(__file__).resolve().parents[1]


def episode_frames(episode: int, steps: int = EPISODE_STEPS) -> dict[str, np.ndarray]:
    """One episode's steps: Atari-like frames (a flat background, a moving paddle and ball,
    a noisy score strip, so they compress as real frames do), actions and rewards."""
    rng = np.random.default_rng(episode)
    t = np.arange(steps)
    obs = np.full((steps, *FRAME), 40 + episode % 7, dtype=np.uint8)
    obs[:, :8, :] = rng.integers(0, 256, (steps, 8, FRAME[1]), dtype=np.uint8) // 64 * 64
    paddle = (t * 3 + episode) % (FRAME[1] - 12)
    ball_y, ball_x = 10 + (t * 5) % 70, (t * 7 + 11 * episode) % 80
    for i in range(steps):
        obs[i, 76:80, paddle[i] : paddle[i] + 12] = 200
        obs[i, ball_y[i] : ball_y[i] + 3, ball_x[i] : ball_x[i] + 3] = 255
    return {
        "obs": obs,
        "action": rng.integers(0, 6, steps).astype(np.int32),
        "reward": (rng.random(steps) < 0.05).astype(np.float32),
    }


def episodes(steps: int) -> Iterator[dict[str, np.ndarray]]:
    """The episodes of ``steps`` steps in all (the last one shorter when they do not divide)."""
    for e, first in enumerate(range(0, steps, EPISODE_STEPS)):
        yield episode_frames(e, min(EPISODE_STEPS, steps - first))


def rate_for(seconds: float, fn: Callable[[], int]) -> float:
    """Units per second of repeated ``fn()`` over about ``seconds``, after one warm-up call."""
    fn()
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        done += fn()
    return done / (time.perf_counter() - started)


# --- TorchRL, in process -------------------------------------------------------------------


def torchrl_rates(steps: int, seconds: float) -> dict[str, Any]:
    """Windows/s and transitions/s of TorchRL's buffers over ``steps`` steps, in process."""
    import tensordict
    import torch
    import torchrl
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import RandomSampler, SliceSampler

    torch.set_num_threads(1)
    parts = list(episodes(steps))
    obs = torch.from_numpy(np.concatenate([p["obs"] for p in parts]))
    episode = torch.cat([torch.full((len(p["obs"]),), i) for i, p in enumerate(parts)])
    action = torch.from_numpy(np.concatenate([p["action"] for p in parts]))
    reward = torch.from_numpy(np.concatenate([p["reward"] for p in parts]))
    data = tensordict.TensorDict(
        {"obs": obs, "action": action, "reward": reward, "episode": episode},
        batch_size=[len(obs)],
    )
    windows = TensorDictReplayBuffer(
        storage=LazyTensorStorage(len(obs)),
        sampler=SliceSampler(slice_len=WINDOW, traj_key="episode", cache_values=True),
        batch_size=WINDOW_BATCH * WINDOW,
    )
    windows.extend(data)

    def sample_windows() -> int:
        batch = windows.sample()
        assert batch["obs"].reshape(WINDOW_BATCH, WINDOW, *FRAME).shape[0] == WINDOW_BATCH
        return WINDOW_BATCH

    ret, discount, next_obs = nstep_fields(parts)
    flat = tensordict.TensorDict(
        {
            "obs": obs,
            "action": action,
            "return": torch.from_numpy(ret),
            "discount": torch.from_numpy(discount),
            "next": {"obs": torch.from_numpy(next_obs)},
        },
        batch_size=[len(obs)],
    )
    transitions = TensorDictReplayBuffer(
        storage=LazyTensorStorage(len(obs)), sampler=RandomSampler(), batch_size=NSTEP_BATCH
    )
    transitions.extend(flat)

    def sample_transitions() -> int:
        batch = transitions.sample()
        assert batch["next", "obs"].shape == (NSTEP_BATCH, *FRAME)
        return NSTEP_BATCH

    version = f"torch {torch.__version__.split('+')[0]}, torchrl {torchrl.__version__}"
    return {
        "version": version,
        "windows": rate_for(seconds, sample_windows),
        "transitions": rate_for(seconds, sample_transitions),
    }


def nstep_fields(parts: list[dict[str, np.ndarray]]) -> tuple[np.ndarray, ...]:
    """Each step's n-step return, discount and next frame (terminated episodes)."""
    rets, discounts, nexts = [], [], []
    for p in parts:
        length = len(p["reward"])
        ret = np.zeros(length)
        for j in range(N_STEP):
            ret[: length - j] += GAMMA**j * p["reward"][j:]
        ahead = np.minimum(np.arange(length) + N_STEP, length)
        discount = np.where(ahead == length, 0.0, GAMMA**N_STEP)
        next_obs = p["obs"][np.minimum(ahead, length - 1)]
        rets.append(ret)
        discounts.append(discount)
        nexts.append(next_obs)
    return np.concatenate(rets), np.concatenate(discounts), np.concatenate(nexts)


def torchrl_in(python: str | None, steps: int, seconds: float) -> dict[str, Any]:
    """:func:`torchrl_rates` here if TorchRL imports, else in ``python`` (a subprocess)."""
    try:
        import torchrl  # noqa: F401
    except ImportError:
        if python is None:
            return {"error": "no TorchRL here nor a venv with it (make .venv-torchrl/bin/python)"}
        return _subprocess(python, "torchrl", steps, seconds)
    return torchrl_rates(steps, seconds)


# --- Reverb, its server and its client each in a process of its own ------------------------

_REVERB_SERVER = """
import sys, reverb
tables = [
    reverb.Table(name=name, sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(),
                 max_size=10**7, rate_limiter=reverb.rate_limiters.MinSize(1))
    for name in ("windows", "nstep")
]
server = reverb.Server(tables=tables, port=None)
print(server.port, flush=True)
sys.stdin.read()
server.stop()
"""


def reverb_client(port: int, steps: int, seconds: float) -> dict[str, Any]:
    """Writes the episodes through ``trajectory_writer``, then reads through
    ``TrajectoryDataset``: the write time, windows/s and transitions/s."""
    from importlib.metadata import version

    import reverb
    import tensorflow as tf

    address = f"localhost:{port}"
    client = reverb.Client(address)
    started = time.perf_counter()
    for part in episodes(steps):
        with client.trajectory_writer(num_keep_alive_refs=WINDOW) as w:
            for i in range(len(part["obs"])):
                w.append({name: part[name][i] for name in ("obs", "action", "reward")})
                if i + 1 >= WINDOW:
                    w.create_item(
                        "windows", 1.0, {k: w.history[k][-WINDOW:] for k in ("obs", "action")}
                    )
                if i >= N_STEP:
                    w.create_item(
                        "nstep",
                        1.0,
                        {
                            "obs": w.history["obs"][-N_STEP - 1],
                            "action": w.history["action"][-N_STEP - 1],
                            "reward": w.history["reward"][-N_STEP - 1 : -1],
                            "next_obs": w.history["obs"][-1],
                        },
                    )
            w.end_episode()
    write_s = time.perf_counter() - started

    def rate(table: str, batch: int, dtypes: dict[str, Any], shapes: dict[str, Any]) -> float:
        dataset = reverb.TrajectoryDataset(
            address,
            table,
            dtypes=dtypes,
            shapes={k: tf.TensorShape(v) for k, v in shapes.items()},
            max_in_flight_samples_per_worker=2 * batch,
        ).batch(batch)
        it = iter(dataset)

        def one() -> int:
            got = next(it)
            return int(got.data["obs"].shape[0])

        return rate_for(seconds, one)

    windows = rate(
        "windows",
        WINDOW_BATCH,
        {"obs": tf.uint8, "action": tf.int32},
        {"obs": [WINDOW, *FRAME], "action": [WINDOW]},
    )
    transitions = rate(
        "nstep",
        NSTEP_BATCH,
        {"obs": tf.uint8, "action": tf.int32, "reward": tf.float32, "next_obs": tf.uint8},
        {"obs": list(FRAME), "action": [], "reward": [N_STEP], "next_obs": list(FRAME)},
    )
    return {
        "version": f"dm-reverb {version('dm-reverb')}, tensorflow {tf.__version__}",
        "write_s": write_s,
        "windows": windows,
        "transitions": transitions,
    }


def reverb_in(python: str, steps: int, seconds: float) -> dict[str, Any]:
    """Reverb's server and client, each a process of ``python``: :func:`reverb_client`."""
    server = subprocess.Popen(
        [python, "-c", _REVERB_SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        port = int(server.stdout.readline())
        return _subprocess(python, "reverb", steps, seconds, str(port))
    finally:
        server.stdin.close()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _subprocess(python: str, arm: str, steps: int, seconds: float, *extra: str) -> dict[str, Any]:
    done = subprocess.run(
        [python, "-m", "bench.episodes_baselines", arm, str(steps), str(seconds), *extra],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"error": f"{arm} failed: {tail[0]}"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


if __name__ == "__main__":
    arm, n, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    if arm == "torchrl":
        print(json.dumps(torchrl_rates(n, secs)))
    else:
        print(json.dumps(reverb_client(int(sys.argv[4]), n, secs)))
