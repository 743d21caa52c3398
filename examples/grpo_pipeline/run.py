"""Runs the GRPO pipeline: one server, four tasks as separate processes, a trainer that is
killed mid-lease and restarted. Prints what each task consumed and checks that the trainer
consumed every rollout once, or that the staleness window dropped it.

``.venv/bin/python examples/grpo_pipeline/run.py [--prompts 12]`` from the repository root,
with a Python that has ``rlreplay[server]`` (bounded: it gives up after ``--timeout-s``).
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
GROUP = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start(role: str, url: str, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(HERE / "tasks.py"), role, "--url", url, *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def lines(process: subprocess.Popen[str], timeout_s: float) -> list[dict[str, object]]:
    out, _ = process.communicate(timeout=timeout_s)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--timeout-s", type=float, default=120)
    parser.add_argument(
        "--no-reservations",
        action="store_true",
        help="generators push as fast as they generate (rollouts then go stale)",
    )
    parser.add_argument(
        "--trainer-step-s", type=float, default=0.3, help="a trainer slower than generators"
    )
    args = parser.parse_args()
    deadline = time.monotonic() + args.timeout_s
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as data:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rlreplay.app",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--data-dir",
                data,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            while not _ready(url):
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the server did not start")
                time.sleep(0.1)
            config: dict[str, object] = {
                "sampler": {"type": "uniform"},
                "max_staleness": 2,
                "delete_after_ack": ["trainer"],
            }
            if not args.no_reservations:  # the generator runs at most 2 groups ahead
                config["admission"] = {"max_ahead": 2 * GROUP}
            pace = ["--no-reservations"] if args.no_reservations else []
            step = ["--step-s", str(args.trainer_step_s)]
            httpx.put(f"{url}/v1/tables/rollouts", json=config).raise_for_status()
            httpx.put(f"{url}/v1/tables/control", json={}).raise_for_status()
            workers = {
                role: start(role, url, "--prompts", str(args.prompts), *pace)
                for role in ("generator", "reference", "reward")
            }
            first = start("trainer", url, "--hang-after", "2", *step)
            consumed: dict[str, list[str]] = {"trainer": []}
            assert first.stdout is not None
            hanging: list[str] = []
            for raw in first.stdout:  # until it holds a lease it will never acknowledge
                line = json.loads(raw)
                if "hanging" in line:
                    hanging = line["hanging"]
                    break
                consumed["trainer"] += line["keys"]
                if time.monotonic() > deadline:
                    raise RuntimeError("the trainer never got to its third batch")
            first.send_signal(signal.SIGKILL)
            first.wait()
            print(f"trainer killed holding {len(hanging)} rollouts: {hanging[0]}..{hanging[-1]}")
            second = start("trainer", url, *step)
            left = lambda: max(1.0, deadline - time.monotonic())  # noqa: E731
            for role, process in workers.items():
                consumed[role] = [
                    k for line in lines(process, left()) for k in line.get("keys", [])
                ]
            consumed["trainer"] += [
                k for line in lines(second, left()) for k in line.get("keys", [])
            ]
            tasks = httpx.get(f"{url}/v1/tables/rollouts/tasks").json()
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(30)
    return report(args.prompts, consumed, tasks, hanging)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def report(
    prompts: int, consumed: dict[str, list[str]], tasks: dict[str, object], hanging: list[str]
) -> int:
    total = prompts * GROUP
    print(f"{'task':<10} {'rollouts':>8} {'groups':>6}  each consumed once")
    ok = True
    for role in ("generator", "reference", "reward", "trainer"):
        keys = consumed[role]
        once = not [k for k, n in Counter(keys).items() if n > 1]
        ok &= once
        groups = len({k.split("/")[0] for k in keys})
        print(f"{role:<10} {len(keys):>8} {groups:>6}  {once}")
    dropped = int(tasks["dropped_stale"])  # type: ignore[call-overload]
    print(f"policy version {tasks['version']}, rollouts dropped as stale: {dropped}")
    trained_groups = {k.split("/")[0] for k in consumed["trainer"]}
    lost = prompts - len(trained_groups) - dropped // GROUP
    print(
        f"groups: {prompts} generated, {len(trained_groups)} trained, "
        f"{dropped // GROUP} dropped stale, {lost} lost"
    )
    trained = set(consumed["trainer"])
    rescued = set(hanging) & trained
    print(
        f"the killed trainer's lease: {len(rescued)} of {len(hanging)} rollouts "
        "trained after it expired"
    )
    ok &= len(trained) + dropped == total
    ok &= rescued == set(hanging) or dropped > 0  # trained after all, or too stale by then
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
