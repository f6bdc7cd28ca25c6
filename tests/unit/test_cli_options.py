"""What every `retrain` command shares: `--version`, `-h` as `--help`."""

from __future__ import annotations

import importlib.metadata
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
