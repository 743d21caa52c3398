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

from rlreplay import DeadlineExceeded, ReplayClient, VersionConflict

TABLE = "rollouts"
GROUP = 8  # rollouts per prompt (GRPO's group)
CONTROL = "control"  # the generator says here that it is done


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def reserve(rb: ReplayClient) -> tuple[str, int]:
    """Slots for one group at the trainer's current version, waiting while the trainer is
    ``admission.max_ahead`` behind (the server wakes the wait when it consumes)."""
    while True:
        version = (await rb.tasks(TABLE))["version"]
        try:
            got = await rb.reserve(TABLE, GROUP, version=version, wait_ms=2000)
        except (DeadlineExceeded, VersionConflict):  # still behind, or the version moved
            continue
        if got.granted == GROUP:
            return got.id, version
        await rb.return_reservation(TABLE, got.id)  # a part of a group is no use: wait on


async def generator(rb: ReplayClient, prompts: int, reservations: bool) -> None:
    """Writes prompt and response of ``GROUP`` rollouts per prompt, tagged with the
    trainer's current policy version; with ``reservations``, it reserves the group's
    slots before generating, so it never runs further ahead than the trainer can use."""
    rng = np.random.default_rng(0)
    for p in range(prompts):
        reservation = None
        if reservations:
            reservation, version = await reserve(rb)
        else:
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
        await rb.push(TABLE, items, reservation=reservation)
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


#: Tokens of one trainer step: two groups of 24-token responses, split over two ranks.
TOKENS_PER_STEP = 2 * GROUP * 24
RANKS = 2


async def trainer(
    rb: ReplayClient, hang_after: int | None, version_every: int, step_s: float
) -> None:
    """Claims whole groups with every field by tokens (``max_tokens`` of the responses),
    split over two data-parallel ranks balanced by length, computes group-relative
    advantages, bumps the policy version every ``version_every`` batches; each step takes
    ``step_s`` (a trainer slower than its generators). With ``hang_after``, it stops
    working while holding its next lease (``run.py`` then kills it with SIGKILL)."""
    batches = 0
    fields = ["response", "ref_logprob", "reward"]
    while True:
        claim = {
            "task": "trainer",
            "batch_size": 2 * GROUP,
            "group_size": GROUP,
            "fields": fields,
            "max_tokens": TOKENS_PER_STEP,
            "length_field": "response",
            "world_size": RANKS,
            "lease_s": 2.0,
        }
        try:
            lease = await rb.claim(TABLE, wait_ms=1000, **claim)  # type: ignore[arg-type]
        except DeadlineExceeded:
            done = await idle_and_done(rb)
            if not done:
                continue
            # the generator is done: the last groups go even if they fill no whole step
            lease = await rb.claim(TABLE, wait_ms=0, partial=True, **claim)  # type: ignore[arg-type]
            if not lease.items:
                mine = (await rb.tasks(TABLE))["tasks"]["trainer"]
                # done once nothing is left to train on, a dead trainer's lease included
                if done and not mine["ready"] and not mine["leased"]:
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
        assert lease.ranks is not None and len(lease.ranks) == RANKS
        await asyncio.sleep(step_s)
        await lease.ack()
        batches += 1
        say(task="trainer", keys=lease.keys, ranks=[len(rank) for rank in lease.ranks])
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
    parser.add_argument("--step-s", type=float, default=0.0)
    parser.add_argument("--no-reservations", action="store_true")
    args = parser.parse_args()
    async with ReplayClient(args.url) as rb:
        if args.task == "generator":
            await generator(rb, args.prompts, not args.no_reservations)
        elif args.task == "reference":
            await scorer(rb, "reference", "ref_logprob")
        elif args.task == "reward":
            await scorer(rb, "reward", "reward")
        else:
            await trainer(rb, args.hang_after, args.version_every, args.step_s)


if __name__ == "__main__":
    started = time.monotonic()
    asyncio.run(main())
    print(json.dumps({"exit": sys.argv[1], "seconds": round(time.monotonic() - started, 2)}))
