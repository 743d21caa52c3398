"""A user's mistake on the ``rlreplay`` command line is one line and exit status 2.

Each case runs the installed ``rlreplay`` console script in a subprocess, as a user would.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from tests.live import free_port, start_server, stop_server

RLREPLAY = shutil.which("rlreplay", path=str(Path(sys.executable).parent)) or "rlreplay"


def rlreplay(
    *argv: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RLREPLAY_")}
    return subprocess.run(
        [RLREPLAY, *argv],
        env={**environ, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def one_line_error(done: subprocess.CompletedProcess[str], command: str = "serve") -> str:
    """The error line, after checking the exit status, the single line and no traceback."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"rlreplay {command}: error: "), done.stderr
    return lines[0]


def serve(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> str:
    args = ("serve", "--data-dir", str(tmp_path / "data"), "--port", str(free_port()), *flags)
    return one_line_error(rlreplay(*args, env=env))


def test_restore_without_a_backup_url(tmp_path: Path) -> None:
    line = serve(tmp_path, "--restore", "latest")
    assert "--restore latest needs a backup URL" in line


def test_an_unknown_log_level(tmp_path: Path) -> None:
    line = serve(tmp_path, "--log-level", "verbose")
    assert "--log-level" in line and "'verbose'" in line and "debug" in line


def test_a_bad_variable_is_named_as_the_variable(tmp_path: Path) -> None:
    done = rlreplay("serve", "--data-dir", str(tmp_path / "data"), env={"RLREPLAY_PORT": "abc"})
    line = one_line_error(done)
    assert "RLREPLAY_PORT='abc'" in line and "--port" not in line
    line = serve(tmp_path, env={"RLREPLAY_LOG_LEVEL": "loud"})
    assert "RLREPLAY_LOG_LEVEL='loud'" in line
    line = serve(tmp_path, env={"RLREPLAY_BACKUP_STORAGE_OPTIONS": "{nope"})
    assert "RLREPLAY_BACKUP_STORAGE_OPTIONS" in line


def test_a_bad_backup_url_and_snapshot_id(tmp_path: Path) -> None:
    assert "'nope://x'" in serve(tmp_path, "--backup-url", "nope://x")
    url = (tmp_path / "b").as_uri()
    line = serve(tmp_path, "--backup-url", url, "--restore", "../etc")
    assert "'../etc'" in line


def test_a_typo_in_a_flag_shows_serves_usage_and_a_suggestion(tmp_path: Path) -> None:
    done = rlreplay("serve", "--prot", "8000")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("usage: rlreplay serve ")
    assert done.stderr.strip().splitlines()[-1] == (
        "rlreplay serve: error: unrecognized arguments: --prot; did you mean --port?"
    )
    done = rlreplay("serv", "--port", "8000")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("did you mean serve?")


def test_a_data_dir_held_by_a_server_is_refused_naming_its_pid(tmp_path: Path) -> None:
    srv = start_server(tmp_path, "--storage-mode", "memory")
    try:
        line = serve(tmp_path, "--storage-mode", "memory")
        assert f"pid {srv.process.pid}" in line and "in use" in line
    finally:
        stop_server(srv)


def test_a_data_dir_whose_rocksdb_another_process_holds(tmp_path: Path) -> None:
    db = Rdict(str(tmp_path / "data" / "rocksdb"), Options(raw_mode=True))
    try:
        line = serve(tmp_path, "--storage-mode", "hybrid")
    finally:
        db.close()
    assert f"pid {os.getpid()}" in line


def test_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = rlreplay("serve", "--data-dir", str(tmp_path / "d"), "--port", str(port))
    assert "cannot listen on 127.0.0.1:" in one_line_error(done)


def test_a_refused_restore_is_one_line(tmp_path: Path) -> None:
    url = (tmp_path / "empty").as_uri()
    args = ("--backup-url", url, "--restore", "20260101T000000.000Z-abcdef")
    done = rlreplay("serve", "--data-dir", str(tmp_path / "d"), "--port", "0", *args)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("rlreplay serve: error: --restore 20260101T000000.000Z-abcdef")


@pytest.mark.parametrize(
    ("argv", "env", "shown"),
    [
        (["--tabel", "t"], {}, "did you mean --table?"),
        (["--table", "t"], {"RLREPLAY_BACKUP_STORAGE_OPTIONS": "[1]"}, "must be a JSON object"),
    ],
    ids=["typo", "bad-variable"],
)
def test_export_mistakes(tmp_path: Path, argv: list[str], env: dict[str, str], shown: str) -> None:
    url = (tmp_path / "b").as_uri()
    done = rlreplay("export", url, *argv, "--format", "jsonl", str(tmp_path / "o.jsonl"), env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("rlreplay export: error: ") and shown in last, done.stderr


def test_parquet_without_pyarrow_is_refused_before_any_fetch(tmp_path: Path) -> None:
    hidden = tmp_path / "no-pyarrow" / "pyarrow"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('pyarrow is not installed')\n")
    url = (tmp_path / "b").as_uri()  # no snapshot there: a fetch would fail first
    out = tmp_path / "o.parquet"
    env = {"PYTHONPATH": str(hidden.parent)}
    done = rlreplay("export", url, "--table", "t", "--format", "parquet", str(out), env=env)
    line = one_line_error(done, "export")
    assert "pyarrow" in line and "'.[export]'" in line and "--format jsonl" in line
