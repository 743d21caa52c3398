"""The four tasks of the GRPO pipeline, each run as its own process (see README.md).

``python tasks.py <generator|reference|reward|trainer> --url URL [...]``: numpy stand-ins
for the models, the real client calls. Each consumer prints one JSON line per batch it
acknowledged (``{"task", "keys"}``) so that ``run.py`` can tell what it consumed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import numpy as np

from rlreplay import DeadlineExceeded, ReplayClient

TABLE = "rollouts"
GROUP = 8  # rollouts per prompt (GRPO's group)
CONTROL = "control"  # the generator says here that it is done


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def generator(rb: ReplayClient, prompts: int) -> None:
    """Writes prompt and response of ``GROUP`` rollouts per prompt, tagged with the
    trainer's current policy version."""
    rng = np.random.default_rng(0)
    for p in range(prompts):
        version = (await rb.tasks(TABLE))["version"]
        prompt = rng.integers(0, 32_000, size=16, dtype=np.int32)
        items = [
            {
                "key": f"p{p}/r{i}",
                "value": {
                    "prompt": prompt,
                    "response": rng.integers(0, 32_000, 24, dtype=np.int32),
                },
                "group": f"p{p}",
                "version": version,
            }
            for i in range(GROUP)
        ]
        await rb.push(TABLE, items)
        say(task="generator", keys=[it["key"] for it in items], version=version)
        await asyncio.sleep(0.05)
    await rb.push(CONTROL, [{"key": "generator_done", "value": True}])


async def idle_and_done(rb: ReplayClient) -> bool:
    return await rb.get(CONTROL, "generator_done") is not None


async def scorer(rb: ReplayClient, task: str, field: str) -> None:
    """The reference model (``ref_logprob``) or the reward model (``reward``): reads
    prompt and response, writes its field, once per rollout."""
    while True:
        try:
            lease = await rb.claim(
                TABLE, task=task, batch_size=GROUP, fields=["prompt", "response"], wait_ms=1000
            )
        except DeadlineExceeded:
            if await idle_and_done(rb):
                return
            continue
        async with lease:  # acknowledged at the end of the block, released on an error
            out = {}
            for item in lease.items:
                response = item["value"]["response"].astype(np.float32)
                if field == "ref_logprob":
                    out[item["key"]] = {field: -np.log1p(response / 32_000.0)}
                else:
                    out[item["key"]] = {field: float(response.mean() / 32_000.0)}
            await rb.patch(TABLE, out)
        say(task=task, keys=lease.keys)


async def trainer(rb: ReplayClient, hang_after: int | None, version_every: int) -> None:
    """Claims whole groups with every field, computes group-relative advantages, bumps the
    policy version every ``version_every`` batches. With ``hang_after``, it stops working
    while holding its next lease (``run.py`` then kills it with SIGKILL)."""
    batches = 0
    fields = ["response", "ref_logprob", "reward"]
    while True:
        try:
            lease = await rb.claim(
                TABLE,
                task="trainer",
                batch_size=2 * GROUP,
                group_size=GROUP,
                fields=fields,
                lease_s=2.0,
                wait_ms=1000,
            )
        except DeadlineExceeded:
            mine = (await rb.tasks(TABLE))["tasks"]["trainer"]
            # done once nothing is left to train on, a dead trainer's lease included
            if await idle_and_done(rb) and not mine["ready"] and not mine["leased"]:
                return
            continue
        if hang_after is not None and batches >= hang_after:
            say(task="trainer", hanging=lease.keys)
            await asyncio.sleep(3600)  # killed here, mid-lease
        rewards = np.array([it["value"]["reward"] for it in lease.items]).reshape(-1, GROUP)
        advantages = (rewards - rewards.mean(1, keepdims=True)) / (
            rewards.std(1, keepdims=True) + 1e-6
        )
        assert np.isfinite(advantages).all()
        await lease.ack()
        batches += 1
        say(task="trainer", keys=lease.keys)
        if batches % version_every == 0:
            version = (await rb.tasks(TABLE))["version"] + 1
            await rb.set_version(TABLE, version)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("task", choices=["generator", "reference", "reward", "trainer"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--hang-after", type=int, default=None)
    parser.add_argument("--version-every", type=int, default=2)
    args = parser.parse_args()
    async with ReplayClient(args.url) as rb:
        if args.task == "generator":
            await generator(rb, args.prompts)
        elif args.task == "reference":
            await scorer(rb, "reference", "ref_logprob")
        elif args.task == "reward":
            await scorer(rb, "reward", "reward")
        else:
            await trainer(rb, args.hang_after, args.version_every)


if __name__ == "__main__":
    started = time.monotonic()
    asyncio.run(main())
    print(json.dumps({"exit": sys.argv[1], "seconds": round(time.monotonic() - started, 2)}))
