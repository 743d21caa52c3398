"""The wheel installs one package, ``rlreplay``, and importing or using its client changes
nothing outside it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IGNORED = shutil.ignore_patterns("__pycache__", "*.egg-info")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # built from a copy, so the checkout gets no build/ or egg-info
    source = tmp_path_factory.mktemp("source")
    for name in ("src", "rlreplay", "app", "workers", "clients", "wire", "gpu"):
        shutil.copytree(REPO / name, source / name, symlinks=True, ignore=IGNORED)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run(
        [
            sys.executable,
            *("-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"),
            *("-w", str(out), str(source)),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (found,) = out.glob("rlreplay-*.whl")
    return found


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


def test_an_installed_wheel_gives_the_client_and_the_service(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), wheel],
        check=True,
        capture_output=True,
        timeout=300,
    )
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
