"""The commands that the README and the examples' READMEs give run as written from a clone.

Every command in a shell block, and every ``pip install`` or ``python`` command in the prose,
is checked against the repository: pip installs only local paths with extras that
pyproject.toml declares (the package is on no index), Python is the virtual environment's
(a shell's ``python`` may lack the packages), scripts and paths exist, ``make`` targets exist,
and ``rlreplay`` flags are the command's own. The README's ``curl`` block and the plugin
example's script are run against a live server.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.live import running_server

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted(REPO.glob("examples/*/README.md"))]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_SPAN = re.compile(r"`([^`\n]+)`")
_PROGRAMS = {"pip", "python", "make", "curl", "rlreplay"}
#: Files the reader makes: "save this as `example.py`".
SAVED = {
    name for d in DOCUMENTS for name in re.findall(r"[Ss]ave this as `([^`]+)`", d.read_text())
}


def _blocks(text: str, *languages: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(text) if lang in languages]


def _shell_commands(text: str) -> list[list[str]]:
    """The commands of the shell blocks, continuation lines joined, comments dropped (but
    for another way to do the same: ``make serve  # or: .venv/bin/rlreplay serve``)."""
    commands = []
    for block in _blocks(text, "sh", "bash", "shell"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            alternative = re.search(r"#\s*or:\s*(.+)$", line)
            commands += [words] if words else []
            commands += [shlex.split(alternative[1])] if alternative else []
    return commands


def _prose_commands(text: str) -> list[list[str]]:
    """``pip install``/``python`` commands in the prose's code spans."""
    prose = _FENCE.sub("", text)
    found = []
    for span in _SPAN.findall(prose):
        words = shlex.split(span, comments=True) if span.count("'") % 2 == 0 else []
        if words and (words[:2] == ["pip", "install"] or words[0].endswith("python")):
            found.append(words)
    return found


def _all_commands() -> list[tuple[str, list[str]]]:
    found = []
    for document in DOCUMENTS:
        text = document.read_text()
        name = str(document.relative_to(REPO))
        found += [(name, words) for words in _shell_commands(text) + _prose_commands(text)]
    return found


COMMANDS = _all_commands()
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
EXTRAS = set(PROJECT["optional-dependencies"])
MAKE_TARGETS = set(re.findall(r"^([\w.-]+):", (REPO / "Makefile").read_text(), re.M))


def _check_pip(words: list[str]) -> None:
    assert words[1] in {"install", "wheel"}, words
    rest = words[2:]
    # what is neither an option nor -w's folder names what to install
    targets = [w for i, w in enumerate(rest) if w[0] != "-" and rest[i - 1 : i] != ["-w"]]
    assert targets, words
    for target in targets:
        path, _, extras = target.partition("[")
        # a requirement from an index would fail: the package is published on none
        assert (REPO / path).exists(), f"{target}: not a path in the repository"
        asked = set(filter(None, extras.rstrip("]").split(",")))
        assert asked <= EXTRAS, f"{target}: extras {asked - EXTRAS} are not in pyproject.toml"


def _check_python(words: list[str]) -> None:
    assert words[0] == ".venv/bin/python", f"{words}: say which Python (the venv's)"
    if words[1] == "-m":
        assert importlib.util.find_spec(words[2]) is not None, words
        paths = [w for w in words[3:] if "/" in w and not w.startswith("-")]
    else:
        paths = [words[1]] if words[1] not in SAVED else []
    for path in paths:
        assert (REPO / path).exists(), f"{path} in {words}"
    if words[1].endswith(".py"):
        _check_flags(words[2:], [sys.executable, str(REPO / words[1]), "--help"])


def _check_flags(words: list[str], help_command: list[str]) -> None:
    flags = {w.split("=")[0] for w in words if w.startswith("--")}
    if not flags:
        return
    result = subprocess.run(
        help_command, cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    for flag in flags:
        assert re.search(rf"{re.escape(flag)}\b", result.stdout), f"{flag}: not a flag"


@pytest.mark.parametrize(
    ("document", "words"), COMMANDS, ids=[f"{d}: {' '.join(w)[:60]}" for d, w in COMMANDS]
)
def test_each_command_runs_from_a_clone_as_written(document: str, words: list[str]) -> None:
    program = words[0].removeprefix(".venv/bin/")
    assert program in _PROGRAMS, f"{document}: {words}: a command this test does not know"
    if program == "pip":
        _check_pip(words)
    elif program == "python":
        _check_python(words)
    elif program == "make":
        assert set(words[1:]) <= MAKE_TARGETS, words
    elif program == "rlreplay":
        assert words[0] == ".venv/bin/rlreplay", f"{words}: say which rlreplay (the venv's)"
        _check_flags(words[2:], [sys.executable, "-m", "rlreplay", words[1], "--help"])


def test_the_commands_were_found() -> None:
    # the parser above must not silently find nothing
    programs = {words[0].removeprefix(".venv/bin/") for _, words in COMMANDS}
    assert {"make", "curl", "pip", "python", "rlreplay"} <= programs
    assert any(words[:3] == ["pip", "install", "-e"] for _, words in COMMANDS)


def test_the_readmes_curl_block_runs_against_a_server(tmp_path: Path) -> None:
    curls = [w for w in _shell_commands((REPO / "README.md").read_text()) if w[0] == "curl"]
    assert len(curls) >= 3
    with running_server(tmp_path) as server:
        address = server.url.removeprefix("http://")
        for words in curls:
            words = [w.replace("localhost:8000", address) for w in words]
            result = subprocess.run(words, capture_output=True, text=True, timeout=60, check=False)
            assert result.returncode == 0, result.stderr
            assert result.stdout.strip() and '"error"' not in result.stdout, result.stdout


def test_the_plugin_examples_script_runs_as_written(tmp_path: Path) -> None:
    readme = (REPO / "examples/score_sampler/README.md").read_text()
    script = _blocks(readme, "python")[0]
    assert "http://127.0.0.1:8000" in script
    with running_server(tmp_path / "server", "--no-default-table") as server:
        path = tmp_path / "best_first.py"
        path.write_text(script.replace("http://127.0.0.1:8000", server.url))
        result = subprocess.run(
            [sys.executable, str(path)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ep2", "ep1", "ep3"]
