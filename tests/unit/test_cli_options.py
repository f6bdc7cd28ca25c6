"""What every `retrain` command shares: `--version`, `-h` as `--help`."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from retrain import cli
from retrain.cli import app

runner = CliRunner()


def every_command(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command's words (`("data", "status")`), the root's `()` first."""
    found = [path]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        found += every_command(sub, (*path, name))
    return found


COMMANDS = every_command(typer.main.get_command(app))


def test_version_prints_the_installed_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"retrain {importlib.metadata.version('retrain')}\n"


def test_version_without_an_installed_distribution_is_pyproject_s(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith("retrain 0.")
    assert cli.version() == result.output.split()[1]


@pytest.mark.parametrize("path", COMMANDS, ids=lambda path: " ".join(path) or "retrain")
def test_h_is_help_on_every_command(path: tuple[str, ...]) -> None:
    short = runner.invoke(app, [*path, "-h"], terminal_width=100)
    long = runner.invoke(app, [*path, "--help"], terminal_width=100)
    assert short.exit_code == long.exit_code == 0, short.output
    assert short.output == long.output
    assert "Usage:" in short.output


# One name per meaning across commands; the old names still work, unlisted.
RENAMED = [
    (("train",), "--nproc", "--processes"),  # as `local demo --processes`
    (("synth",), "--version", "--dataset-version"),  # as `plan-job` and the trainer; --version is the tool's
]


def _options(path: tuple[str, ...]) -> dict[str, Any]:
    command: Any = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return {opt: param for param in command.params for opt in param.opts}


@pytest.mark.parametrize(("path", "old", "new"), RENAMED, ids=lambda value: value if isinstance(value, str) else None)
def test_an_old_option_name_is_accepted_and_not_shown(path: tuple[str, ...], old: str, new: str) -> None:
    options = _options(path)
    assert not options[new].hidden
    assert options[old].hidden
    help_text = runner.invoke(app, [*path, "--help"], terminal_width=200).output
    assert new in help_text
    assert f"{old} " not in help_text


def test_synth_takes_its_dataset_version_under_both_names(tmp_path: Path) -> None:
    for flag in ("--dataset-version", "--version"):
        out = tmp_path / flag.strip("-")
        result = runner.invoke(app, ["synth", str(out), "--count", "4", "--size", "32x16", flag, "v-test"])
        assert result.exit_code == 0, result.output
        assert (out / "manifests" / "v-test.jsonl").is_file()
