"""One replay server as a Ray actor: ``rlreplay serve`` in a subprocess the actor owns.

:mod:`rlreplay.clients.ray_launcher` places one :class:`ReplayServerActor` per node (hard node
affinity) and Ray restarts it when its process dies. Each start, first or restarted, runs
``rlreplay serve`` on the node's address with the same data directory (node-local, so a
restart on the same node finds the log and the RocksDB files its last process left) and,
when there is one, ``--restore latest`` from its own backup prefix, which restores only into
an empty directory. The port it last served on is kept in the data directory and tried
first, so clients that hold the old address usually reach it again; the registry
(:class:`~rlreplay.clients.ray_registry.ReplayRegistry`) learns the address either way.

The subprocess is started with ``PR_SET_PDEATHSIG`` (Linux), so a SIGKILL of the actor's
process takes the server with it, and the next start waits for the last one's pid to be
gone before it takes the data directory's lock. The other way round, a server that exits
while the actor has not asked it to (a crash, the OOM killer) ends the actor's process
too, so that Ray restarts both.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

__all__ = ["ReplayServerActor", "free_port"]

_PR_SET_PDEATHSIG = 1
_PORT_FILE = "ray-port"
_PID_FILE = "ray-server.pid"
_LOG_FILE = "ray-server.log"
#: The exit statuses of a server stopped by SIGTERM.
_CLEAN = frozenset({0, -signal.SIGTERM})


def free_port(host: str, preferred: int = 0) -> int:
    """``preferred`` when ``host`` can bind it now, else a port the kernel picks."""
    for port in (preferred, 0) if preferred else (0,):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise OSError(f"no free port on {host}")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _wait_gone(pid: int, deadline: float) -> None:
    """Wait until no process has ``pid`` (the last start's server), or the deadline."""
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:  # someone else's process reuses the pid
            return
        time.sleep(0.05)


class ReplayServerActor:
    """The body of one server actor (wrapped by ``ray.remote`` in the launcher).

    Args:
        name: The deployment's name (the registry's is ``rlreplay:<name>``).
        index: This server's index, which names its shard, its folder and its prefix.
        registry: The registry actor's handle, told this server's address at each start.
        data_root: The node-local folder that holds ``<name>-<index>/``.
        backup_url: This server's own backup URL (a prefix per server), or None.
        host: The address to bind; the node's address (Ray's view of it) when None.
        serve_flags: More ``rlreplay serve`` flags.
        ready_timeout_s: How long the server may take to answer ``/readyz``.

    Raises:
        RuntimeError: The server exited or did not get ready in time; the message holds
            the end of its log.
    """

    def __init__(
        self,
        name: str,
        index: int,
        *,
        registry: Any,
        data_root: str,
        backup_url: str | None,
        host: str | None,
        serve_flags: Sequence[str],
        ready_timeout_s: float,
    ) -> None:
        import ray

        context = ray.get_runtime_context()
        self._name = f"{name}-{index}"
        self._node_id = context.get_node_id()
        self._host = host or ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self._data_dir = Path(data_root) / self._name
        self._data_dir.mkdir(parents=True, exist_ok=True)
        self._backup_url = backup_url
        deadline = time.monotonic() + ready_timeout_s
        self._forget_last_server(deadline)
        self._port = free_port(self._host, self._last_port())
        (self._data_dir / _PORT_FILE).write_text(str(self._port))
        self.url = f"http://{_url_host(self._host)}:{self._port}"
        self._process = self._start(serve_flags)
        self._stopping = threading.Event()
        self._wait_ready(deadline)
        self._watcher = threading.Thread(
            target=self._exit_with_server, name="rlreplay-server-watcher", daemon=True
        )
        self._watcher.start()
        self._restarts = context.was_current_actor_reconstructed
        ray.get(registry.register.remote(index, self.url, self._node_id), timeout=30)

    def _last_port(self) -> int:
        with contextlib.suppress(OSError, ValueError):
            return int((self._data_dir / _PORT_FILE).read_text())
        return 0

    def _forget_last_server(self, deadline: float) -> None:
        """Wait for the server of the last start (killed with its actor) to be gone."""
        with contextlib.suppress(OSError, ValueError):
            _wait_gone(int((self._data_dir / _PID_FILE).read_text()), deadline)

    def _start(self, serve_flags: Sequence[str]) -> subprocess.Popen[bytes]:
        command = [
            sys.executable,
            "-m",
            "rlreplay",
            "serve",
            "--host",
            self._host,
            "--port",
            str(self._port),
            "--data-dir",
            str(self._data_dir),
        ]
        if self._backup_url:
            command += ["--backup-url", self._backup_url, "--restore", "latest"]
        command += list(serve_flags)
        with open(self._data_dir / _LOG_FILE, "ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        (self._data_dir / _PID_FILE).write_text(str(process.pid))
        return process

    def _exit_with_server(self) -> None:
        """Ends the actor's process when its server exits unasked, so Ray restarts it."""
        self._process.wait()
        if not self._stopping.is_set():
            os._exit(1)

    def _wait_ready(self, deadline: float) -> None:
        with httpx.Client(timeout=2.0, trust_env=False) as http:
            while time.monotonic() < deadline:
                if self._process.poll() is not None:
                    raise RuntimeError(
                        f"replay server {self._name} exited with status "
                        f"{self._process.returncode}:\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if http.get(f"{self.url}/readyz").status_code == 200:
                        return
                time.sleep(0.1)
        self._process.kill()
        raise RuntimeError(f"replay server {self._name} not ready in time:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the server's log (stdout and stderr)."""
        try:
            text = (self._data_dir / _LOG_FILE).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def info(self) -> dict[str, Any]:
        """Where this server is: its URL, node, folder, the pids, whether Ray restarted it."""
        return {
            "name": self._name,
            "url": self.url,
            "node_id": self._node_id,
            "data_dir": str(self._data_dir),
            "backup_url": self._backup_url,
            "actor_pid": os.getpid(),
            "server_pid": self._process.pid,
            "restarted": self._restarts,
            "running": self._process.poll() is None,
        }

    def stop(self, *, snapshot: bool, timeout_s: float = 60.0) -> dict[str, Any]:
        """Stop the server: a final snapshot first when asked and it has a backup URL,
        then SIGTERM (it applies what is queued and checkpoints), SIGKILL past
        ``timeout_s``. Calling it again does nothing.

        Returns:
            ``{"snapshot": the snapshot's answer or None, "returncode": the exit status,
            "clean": whether it stopped on SIGTERM}`` (uvicorn ends a clean stop by
            raising the signal again: ``-SIGTERM``).
        """
        taken = None
        killed = False
        self._stopping.set()
        if self._process.poll() is None and snapshot and self._backup_url:
            from rlreplay.clients.sync_client import Client

            with Client(self.url, timeout_s=timeout_s, retries=1) as rb:
                taken = rb.snapshot(timeout_s=timeout_s)
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                killed = True
                self._process.kill()
                self._process.wait()
        with contextlib.suppress(OSError):
            (self._data_dir / _PID_FILE).unlink()
        code = self._process.returncode
        return {"snapshot": taken, "returncode": code, "clean": not killed and code in _CLEAN}


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
