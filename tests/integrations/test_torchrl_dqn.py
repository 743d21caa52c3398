"""TorchRL's CartPole DQN learns through the rlreplay-backed buffer.

The training loop is TorchRL's ``sota-implementations/dqn/dqn_cartpole.py`` (its
``make_env``, Q-network, ``EGreedyModule``, ``DQNLoss`` with a delayed target and
``HardUpdate``, a ``Collector``) with its ``TensorDictReplayBuffer`` swapped for
:class:`~rlreplay.clients.torchrl_buffer.TableReplayBuffer` over a live server's table, and
its schedule shortened (collection, exploration and target updates) so that it learns
within a bounded number of frames; no logger, checkpoint or compilation. The greedy policy
must reach a mean return of 150 over 3 evaluation episodes (a random policy scores about
22) within 20,000 frames (with seed 0 it passed 200 at 4,000).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")
pytest.importorskip("gymnasium")

import rlreplay  # noqa: E402
from rlreplay.clients.torchrl_buffer import TableReplayBuffer  # noqa: E402
from tests.live import running_server  # noqa: E402

pytestmark = pytest.mark.slow

FRAMES_PER_BATCH = 200
UPDATES_PER_BATCH = 60
MAX_FRAMES = 20_000
GOAL = 150.0


def test_torchrl_dqn_learns_cartpole_through_the_table(tmp_path: Path) -> None:
    with warnings.catch_warnings():  # torchrl.collectors warns about its own classes
        warnings.simplefilter("ignore", DeprecationWarning)
        from tensordict.nn import TensorDictSequential
        from torchrl.collectors import Collector
        from torchrl.data import Composite
        from torchrl.envs import (
            ExplorationType,
            RewardSum,
            StepCounter,
            TransformedEnv,
            set_exploration_type,
        )
        from torchrl.envs.libs.gym import GymEnv
        from torchrl.modules import MLP, EGreedyModule, QValueActor
        from torchrl.objectives import DQNLoss, HardUpdate

    torch.manual_seed(0)

    def make_env() -> TransformedEnv:
        env = TransformedEnv(GymEnv("CartPole-v1", device="cpu"))
        env.append_transform(RewardSum())
        env.append_transform(StepCounter())
        return env

    proof = make_env()
    action_spec = proof.specs["input_spec", "full_action_spec", "action"]
    model = QValueActor(
        module=MLP(
            in_features=proof.observation_spec["observation"].shape[-1],
            activation_class=torch.nn.ReLU,
            out_features=action_spec.space.n,
            num_cells=[120, 84],
        ),
        spec=Composite(action=action_spec),
        in_keys=["observation"],
    )
    greedy = EGreedyModule(annealing_num_steps=10_000, eps_init=1.0, eps_end=0.05, spec=model.spec)
    loss_module = DQNLoss(value_network=model, loss_function="l2", delay_value=True)
    loss_module.make_value_estimator(gamma=0.99)
    target_updater = HardUpdate(loss_module, value_network_update_interval=100)
    optimizer = torch.optim.Adam(loss_module.parameters(), lr=1e-3)
    collector = Collector(
        create_env_fn=make_env,
        policy=TensorDictSequential(model, greedy),
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=MAX_FRAMES,
        device="cpu",
        storing_device="cpu",
        max_frames_per_traj=-1,
        init_random_frames=1_000,
        auto_register_policy_transforms=False,
    )
    test_env = make_env()

    def evaluate() -> float:
        with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
            returns = [
                test_env.rollout(500, model, auto_reset=True)["next", "reward"].sum().item()
                for _ in range(3)
            ]
        return sum(returns) / len(returns)

    score, frames, scores = 0.0, 0, []
    with running_server(tmp_path, "--no-default-table", "--seed", "0") as server:
        with rlreplay.Client(server.url) as client:
            replay_buffer = TableReplayBuffer(
                client,
                "dqn",
                batch_size=128,
                writer_id=0,
                create={"sampler": {"type": "uniform"}, "max_size": 10_000},
            )
            try:
                for data in collector:
                    data = data.reshape(-1)
                    replay_buffer.extend(data)
                    frames += data.numel()
                    greedy.step(data.numel())
                    if frames < 1_000:
                        continue
                    for _ in range(UPDATES_PER_BATCH):
                        sampled = replay_buffer.sample()
                        loss = loss_module(sampled)["loss"]
                        optimizer.zero_grad()
                        loss.backward()
                        optimizer.step()
                        target_updater.step()
                    if frames % 2_000 == 0:
                        score = evaluate()
                        scores.append((frames, score))
                        if score >= GOAL:
                            break
            finally:
                collector.shutdown()
    assert score >= GOAL, f"(frames, mean greedy return) at each evaluation: {scores}"
