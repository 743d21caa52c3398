"""``pip install -e .`` from a clone is followed by type checkers, and a script beside the
clone imports the package, not the clone's folder.

The build looks in ``src/`` (one link, ``src/rlreplay -> ../rlreplay``), so the editable
install is a ``.pth`` path entry to ``src/``: mypy and IDEs read such entries (not the import
hooks that setuptools uses otherwise), and on ``sys.path`` a regular package beats the
namespace package that a folder named ``rlreplay`` beside the script would make.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import lean_env


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout in a folder named ``rlreplay``, as ``git clone`` makes it."""
    return lean_env.copy_source(tmp_path_factory.mktemp("x") / "rlreplay")


@pytest.fixture(scope="module")
def python(clone: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An environment holding the clone's editable install (what ``pip install -e .`` writes,
    from the same build backend call) and the client's dependencies."""
    out = tmp_path_factory.mktemp("editable")
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"from setuptools import build_meta; build_meta.build_editable({str(out)!r})",
        ],
        cwd=clone,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("rlreplay-*.whl")
    return lean_env.make_env(tmp_path_factory.mktemp("env") / "venv", wheel)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL"))}


def test_a_script_beside_the_clone_imports_the_package(clone: Path, python: Path) -> None:
    script = clone.parent / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import rlreplay
            print(rlreplay.__file__)
            print(rlreplay.ReplayClient.__name__)
            """
        )
    )
    result = subprocess.run(
        [str(python), script.name],
        cwd=clone.parent,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    where, name = result.stdout.split()
    assert Path(where) == clone / "src" / "rlreplay" / "__init__.py"
    assert name == "ReplayClient"


def test_mypy_outside_the_repository_finds_the_editable_install(
    python: Path, tmp_path: Path
) -> None:
    result = subprocess.run(
        [
            *(sys.executable, "-m", "mypy", "--python-executable", str(python)),
            *("--cache-dir", str(tmp_path / "cache"), "--follow-imports", "silent"),
            *("-c", "import rlreplay; reveal_type(rlreplay.ReplayClient)"),
        ],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "-> rlreplay.clients.client.ReplayClient" in result.stdout, result.stdout
