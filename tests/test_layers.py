"""The layers of docs/architecture.md hold: import-linter's contracts (pyproject.toml) pass,
and a back-import planted in a copy of the package breaks them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """Runs the contracts with ``root`` first on the path (so its ``rlreplay`` is analysed)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(REPO / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def copy_package(dest: Path) -> Path:
    """A copy of ``rlreplay`` with its links to the design's folders resolved."""
    shutil.copytree(REPO / "rlreplay", dest / "rlreplay", symlinks=False)
    return dest


def test_the_layer_contracts_hold() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "planted", "broken"),
    [
        # selection below tables: a sampler may not reach up into the table that holds it
        ("app/selection/base.py", "import rlreplay.app.tables.table", "layers point one way"),
        # the writer below the engine that owns it
        ("app/writer/apply.py", "import rlreplay.app.engine.engine", "layers point one way"),
        # workers below the service: the blocking-work pools know nothing of tables
        ("workers/blocking.py", "import rlreplay.app.tables.table", "Top-level folders"),
        # the wire package below everything
        ("wire/codec.py", "import rlreplay.app.settings", "layers point one way"),
        # the client installs without the service
        ("clients/retry.py", "import rlreplay.app.api.errors", "needs nothing of the service"),
        # one package name: the folders behind the links are never imported by their own name
        ("app/engine/core.py", "import workers.blocking", "never the folders"),
        # the sidecar speaks the contract, never the service's insides
        ("gpu/follower.py", "import rlreplay.app.tables.table", "only through the client"),
        # the server starts without torch
        ("app/api/changes.py", "import torch", "service never loads torch"),
        ("clients/columns.py", "import rlreplay.gpu.sampler", "never load the GPU sidecar"),
    ],
)
def test_a_back_import_breaks_a_contract(
    tmp_path: Path, module: str, planted: str, broken: str
) -> None:
    root = copy_package(tmp_path)
    target = root / "rlreplay" / module
    target.write_text(target.read_text() + f"\n{planted}  # noqa\n")
    result = lint_imports(root)
    assert result.returncode != 0, result.stdout
    broken_lines = [line for line in result.stdout.splitlines() if " BROKEN" in line]
    assert any(broken in line for line in broken_lines), result.stdout
