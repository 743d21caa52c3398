"""The wheel installs one package, ``rlreplay``; each install holds what its use needs and
nothing more: ``pip install .`` the client, ``.[server]`` the service, ``.[gpu]`` the
sidecar. Each is checked in its metadata and by running it in an environment that holds
exactly that install (tests/lean_env.py), so a module an extra forgot is absent there."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests import lean_env
from tests.live import free_port, running_server

CLIENT = {"httpx", "msgpack", "msgspec", "numpy", "zstandard"}
SERVICE = {
    "fastapi",
    "uvicorn",
    "pydantic",
    "pydantic-settings",
    "rocksdict",
    "xxhash",
    "prometheus-client",
    "fsspec",
    "fastapi-offline",
    "tqdm",
    "zstandard",
}
#: What the client must never bring: the service's stack, torch, the test tools.
NOT_THE_CLIENTS = (SERVICE - CLIENT) | {"starlette", "torch", "pytest", "pyarrow", "s3fs"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # built from a copy, so the checkout gets no build/ or egg-info
    source = lean_env.copy_source(tmp_path_factory.mktemp("source"))
    return lean_env.build_wheel(source, tmp_path_factory.mktemp("wheel"))


def _by_extra(wheel: Path) -> dict[str, list[Requirement]]:
    """The wheel's requirements by extra ("" for the base install)."""
    found: dict[str, list[Requirement]] = {}
    for requirement in lean_env.wheel_requirements(wheel):
        marker = str(requirement.marker or "")
        extra = marker.split("==")[-1].strip(" \"'") if marker else ""
        assert not marker or marker.startswith("extra =="), marker
        found.setdefault(extra, []).append(requirement)
    return found


def _names(requirements: list[Requirement]) -> set[str]:
    return {canonicalize_name(r.name) for r in requirements}


def test_the_wheel_holds_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"rlreplay"}
    for part in ("app", "workers", "clients", "wire", "gpu"):
        assert f"rlreplay/{part}/__init__.py" in names
    assert "rlreplay/py.typed" in names
    assert not [n for n in names if "/bench/" in n]
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "rlreplay = rlreplay.command:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_pip_install_dot_requires_the_client_alone(wheel: Path) -> None:
    assert _names(_by_extra(wheel)[""]) == CLIENT
    # nor anything of the service through them
    assert not lean_env.closure(wheel) & NOT_THE_CLIENTS


def test_the_server_extra_holds_the_service_without_torch(wheel: Path) -> None:
    extras = _by_extra(wheel)
    assert _names(extras["server"]) == SERVICE
    uvicorn = next(r for r in extras["server"] if r.name == "uvicorn")
    assert "standard" in uvicorn.extras  # httptools: the service's own HTTP layer uses it
    assert "torch" not in lean_env.closure(wheel, ["server"])
    # every extra that runs the service brings it
    for extra in ("s3", "gcs", "hdfs", "export", "test"):
        (itself,) = [r for r in extras[extra] if r.name == "rlreplay"]
        assert "server" in itself.extras


def test_torch_comes_only_with_the_gpu_and_torch_extras_and_as_a_range(wheel: Path) -> None:
    for extra, requirements in _by_extra(wheel).items():
        for requirement in requirements:
            if requirement.name == "torch":
                assert extra in {"gpu", "torch"}, extra
                assert str(requirement.specifier) == ">=2.4"
    assert "fastapi" not in lean_env.closure(wheel, ["gpu"])  # the sidecar is no service
    test = _by_extra(wheel)["test"]
    assert {"nbclient", "nbformat", "ipykernel"} <= _names(test)
    (itself,) = [r for r in test if r.name == "rlreplay"]
    assert {"server", "gpu"} <= itself.extras


def test_an_installed_wheel_gives_the_client_and_the_service(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    lean_env.install_wheel(wheel, target)
    script = textwrap.dedent(
        """
        import rlreplay
        from rlreplay import ReplayClient, TableNotFound, ReplayError
        assert rlreplay.__file__.startswith(TARGET), rlreplay.__file__
        assert issubclass(TableNotFound, ReplayError)
        import rlreplay.app.main  # the service imports from the wheel too
        import sys
        assert "torch" not in sys.modules  # the server starts without torch
        assert rlreplay.GpuSampler.__module__ == "rlreplay.gpu.sampler"
        print("ok")
        """
    ).replace("TARGET", repr(str(target)))
    # PYTHONPATH comes before site-packages, where the checkout's editable install is
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def _run(python: Path, script: str, cwd: Path) -> str:
    result = subprocess.run(
        [str(python), "-c", textwrap.dedent(script)],
        cwd=cwd,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _clean_env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if not k.startswith(("RLREPLAY_", "PYTHON", "VIRTUAL"))
    }


@pytest.fixture(scope="module")
def client_python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of an environment holding ``pip install .`` alone."""
    return lean_env.make_env(tmp_path_factory.mktemp("client") / "env", wheel)


def test_the_client_works_with_only_pip_install_dot(client_python: Path, tmp_path: Path) -> None:
    python = client_python
    with running_server(tmp_path / "server", "--no-default-table") as server:
        out = _run(
            python,
            f"""
            import asyncio, importlib.util
            import numpy as np
            import rlreplay
            for absent in ("fastapi", "starlette", "rocksdict", "pydantic", "torch"):
                assert importlib.util.find_spec(absent) is None, absent

            async def main():
                async with rlreplay.ReplayClient({server.url!r}) as rb:
                    await rb.create_table("t", sampler={{"type": "uniform"}})
                    obs = np.arange(6, dtype=np.float32)
                    await rb.push("t", [{{"key": "k", "value": {{"obs": obs}}}}], wait=True)
                    [item] = await rb.sample("t", batch_size=1)
                    assert np.array_equal(item["value"]["obs"], obs)
                    print(item["key"])

            asyncio.run(main())
            """,
            tmp_path,
        )
    assert out.strip() == "k"


def test_rlreplay_serve_without_the_server_extra_names_it(
    client_python: Path, tmp_path: Path
) -> None:
    result = subprocess.run(
        [str(client_python), "-m", "rlreplay", "serve", "--port", str(free_port())],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("rlreplay serve: error: No module named "), result.stderr
    assert "pip install -e '.[server]'" in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr


@contextlib.contextmanager
def _process(cmd: list[str], cwd: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as sink:
        process = subprocess.Popen(cmd, cwd=cwd, env=_clean_env(), stdout=sink, stderr=sink)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text(errors="replace")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready:\n{log.read_text(errors='replace')}")


def test_the_service_runs_with_only_the_server_extra(wheel: Path, tmp_path: Path) -> None:
    python = lean_env.make_env(tmp_path / "env", wheel, ["server"])
    _run(python, "import importlib.util as u; assert u.find_spec('torch') is None", tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(python), "-m", "rlreplay", "serve", "--host", "127.0.0.1", "--port", str(port)]
    log = tmp_path / "server.log"
    with _process([*cmd, "--data-dir", str(tmp_path / "data")], tmp_path, log) as process:
        _wait_ready(url, process, log, 120)
        with httpx.Client(base_url=url, timeout=30) as http:
            assert http.put("/v1/tables/t", json={}).status_code == 201
            push = {"items": [{"key": "a", "value": {"x": 1}}], "wait": True}
            assert http.post("/v1/tables/t/items", json=push).status_code == 200
            sample = http.post("/v1/tables/t/sample", json={"batch_size": 1})
            assert sample.json()["items"][0]["key"] == "a"
            for page in ("/docs", "/redoc", "/openapi.json", "/metrics"):
                assert http.get(page).status_code == 200, page
    assert "Traceback" not in log.read_text(errors="replace")


def test_the_sidecar_runs_with_only_the_gpu_extra(wheel: Path, tmp_path: Path) -> None:
    python = lean_env.make_env(tmp_path / "env", wheel, ["gpu"])
    _run(python, "import importlib.util as u; assert u.find_spec('fastapi') is None", tmp_path)
    with running_server(tmp_path / "server", "--no-default-table") as server:
        httpx.put(f"{server.url}/v1/tables/t", json={}, timeout=30).raise_for_status()
        port = free_port()
        cmd = [str(python), "-m", "rlreplay", "sidecar", "--server", server.url, "--table", "t"]
        cmd += ["--device", "cpu", "--host", "127.0.0.1", "--port", str(port)]
        log = tmp_path / "sidecar.log"
        with _process(cmd, tmp_path, log) as process:
            _wait_ready(f"http://127.0.0.1:{port}", process, log, 180)
        assert "Traceback" not in log.read_text(errors="replace")
