"""The ``rlreplay`` command line: flags, environment variables and their precedence."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlreplay.app import package_version
from rlreplay.app.cli import build_parser, main, settings_from_args
from rlreplay.app.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def parse(*argv: str) -> Settings:
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_every_setting_has_a_flag() -> None:
    help_text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()  # type: ignore[union-attr]
    for name in Settings.model_fields:
        flag = "--" + name.replace("_", "-")
        assert flag in help_text, flag
        assert f"RLREPLAY_{name.upper()}" in help_text.replace("\n", "").replace(" ", "")
    for flag in (
        "--host",
        "--port",
        "--data-dir",
        "--storage-mode",
        "--cache-memory-limit-mb",
        "--durability",
        "--backup-url",
        "--backup-interval-s",
        "--backup-keep",
        "--restore",
        "--max-request-mb",
        "--api-key",
    ):
        assert flag in help_text


def test_flags_beat_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLREPLAY_PORT", "9001")
    monkeypatch.setenv("RLREPLAY_STORAGE_MODE", "disk")
    monkeypatch.setenv("RLREPLAY_BACKUP_URL", "memory://env")
    s = parse("--port", "9002")
    assert s.port == 9002  # the flag
    assert s.storage_mode == "disk"  # the variable
    assert s.backup_url == "memory://env"
    assert parse().port == 9001


def test_flag_types() -> None:
    s = parse(
        "--api-key",
        "a",
        "--api-key",
        "b",
        "--no-default-table",
        "--default-table-max-size",
        "10",
        "--backup-storage-options",
        '{"anon": true}',
        "--max-request-mb",
        "0.5",
        "--data-dir",
        "/tmp/x",
        "--backup-url",
        "none",
    )
    assert s.api_key == ["a", "b"]
    assert s.default_table is False
    assert s.default_table_max_size == 10
    assert s.backup_storage_options == {"anon": True}
    assert s.max_request_mb == 0.5
    assert s.data_dir == Path("/tmp/x")
    assert s.backup_url is None


def test_invalid_values_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--port", "99999"])
    assert exc.value.code == 2
    assert "--port" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--storage-mode", "floppy"])
    assert exc.value.code == 2


def test_the_sidecar_runs_through_the_rlreplay_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["sidecar", "--server", "http://x", "--table", "t"])
    assert exc.value.code == 2
    assert "rlreplay.command" in capsys.readouterr().err
    out = subprocess.run(
        [sys.executable, "-m", "rlreplay", "sidecar", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "--server" in out and "--device" in out


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["-m", "rlreplay.app", "--help"], ["--storage-mode", "RLREPLAY_"]),
        (["-c", "from rlreplay.command import main; main()", "--help"], ["serve", "sidecar"]),
    ],
    ids=["python-m-app", "console-script"],
)
def test_help_of_the_console_script_and_python_m_app(argv: list[str], shown: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert all(word in out for word in shown), out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"rlreplay {package_version()}"
    assert package_version() != "0.0.0"  # the project is installed (editable) in the venv


def test_every_setting_is_documented_with_its_flag_and_variable() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs/configuration.md").read_text()
    missing = [
        name
        for name in Settings.model_fields
        if f"`--{name.replace('_', '-')}" not in doc or f"`RLREPLAY_{name.upper()}`" not in doc
    ]
    assert not missing, f"docs/configuration.md lacks {missing}"
