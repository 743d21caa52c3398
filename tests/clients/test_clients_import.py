"""The client installs on a trainer's machine: no server dependencies, torch only on demand.

msgspec is a client dependency: the wire schemas, which the client encodes its requests
with, are msgspec Structs.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKED = [
    "fastapi",
    "starlette",
    "pydantic",
    "pydantic_settings",
    "rocksdict",
    "uvicorn",
    "torch",
    "rlreplay.app",
    "rlreplay.workers",
    "rlreplay.gpu",
]

SCRIPT = textwrap.dedent(
    """
    import sys

    BLOCKED = set(sys.argv[1].split(","))

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, Blocker())

    import numpy as np
    import rlreplay.clients
    from rlreplay import ReplayClient as TopLevelClient
    assert TopLevelClient is rlreplay.clients.ReplayClient
    from rlreplay.clients import ReplayClient
    from rlreplay.wire.codec import packb, unpackb, to_jsonable, from_jsonable
    import rlreplay.clients.client, rlreplay.clients.retry
    import rlreplay.wire.codec, rlreplay.wire.arrays, rlreplay.wire.errors, rlreplay.wire.schemas

    value = {"obs": np.arange(4, dtype="<f4"), "b": b"x"}
    back = unpackb(packb(value))
    assert back["obs"].tobytes() == value["obs"].tobytes()
    assert from_jsonable(to_jsonable(value))["b"] == b"x"
    ReplayClient("http://127.0.0.1:1")
    loaded = sorted(
        m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BLOCKED)
    )
    assert not loaded, loaded
    print("ok")
    """
)


def test_clients_import_without_server_dependencies_or_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, ",".join(BLOCKED)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_torch_stays_unimported_until_a_tensor_is_used() -> None:
    script = textwrap.dedent(
        """
        import sys
        import numpy as np
        from rlreplay.wire.codec import packb, unpackb
        unpackb(packb({"a": np.zeros(3), "b": [1, "x"]}))
        assert "torch" not in sys.modules
        import torch
        assert unpackb(packb(torch.ones(2))).tolist() == [1.0, 1.0]
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
