"""Virtual environments that hold exactly what one install of rlreplay would: the package
from a wheel built here, and the distributions its requirements (with the extras asked for)
name, transitively, linked from the test's own environment. Nothing is downloaded, so the
tests that use them run offline; a module that an extra forgot is simply absent.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
#: What a clone holds that the wheel is built from.
SOURCE_PARTS = ("src", "rlreplay", "app", "workers", "clients", "wire", "gpu")
_IGNORED = shutil.ignore_patterns("__pycache__", "*.egg-info")


def copy_source(target: Path) -> Path:
    """Copies what the build needs (the package's folders and links, pyproject.toml, the
    README) into ``target``, as a clone would have them; returns ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    for name in SOURCE_PARTS:
        shutil.copytree(REPO / name, target / name, symlinks=True, ignore=_IGNORED)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, target / name)
    return target


def build_wheel(source: Path, out: Path) -> Path:
    """The wheel of ``source``, built without build isolation (no index needed)."""
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


def wheel_requirements(wheel: Path) -> list[Requirement]:
    """The wheel's ``Requires-Dist`` lines."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(name).decode()
    lines = [line for line in text.splitlines() if line.startswith("Requires-Dist: ")]
    return [Requirement(line.removeprefix("Requires-Dist: ")) for line in lines]


def _wanted(requirement: Requirement, extras: Iterable[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in ("", *extras))


def closure(wheel: Path, extras: Iterable[str] = ()) -> set[str]:
    """The canonical names of every distribution that installing the wheel with ``extras``
    brings, transitively (found in this environment), the package itself left out."""
    own = wheel_requirements(wheel)
    todo = [r for r in own if _wanted(r, extras)]
    visited: set[tuple[str, frozenset[str]]] = set()
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name == "rlreplay":  # one extra naming others: rlreplay[server]
            todo += [r for r in own if _wanted(r, requirement.extras)]
            continue
        key = (name, frozenset(requirement.extras))
        if key in visited:
            continue
        visited.add(key)
        requires = metadata.distribution(name).requires or []
        todo += [r for r in map(Requirement, requires) if _wanted(r, requirement.extras)]
    return {name for name, _ in visited}


def make_env(root: Path, wheel: Path, extras: Iterable[str] = ()) -> Path:
    """A virtual environment at ``root`` with the wheel and what it needs with ``extras``;
    returns its python."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(root)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = root / "lib" / version / "site-packages"
    install_wheel(wheel, site)
    link_distributions(closure(wheel, extras), site)
    return root / "bin" / "python"


def install_wheel(wheel: Path, site: Path) -> None:
    """Unpacks ``wheel`` into ``site`` (pip, without dependencies)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), wheel],
        check=True,
        capture_output=True,
        timeout=300,
    )


def link_distributions(names: Iterable[str], site: Path) -> None:
    """Links the top-level files and folders of each named distribution (its modules and
    its metadata) from this environment into ``site``."""
    for name in names:
        distribution = metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in distribution.files or ()}
        for top in tops - {"..", "__pycache__"}:
            link = site / top
            if not link.exists():
                link.symlink_to(Path(str(distribution.locate_file(top))).resolve())
