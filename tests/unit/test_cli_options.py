"""What every `retrain` command shares: `--version`, `-h` as `--help`, `--json` where it reports a result."""

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


# The commands that report no result, and why: every other command takes --json (one JSON
# document on stdout). A new command reports a result, and takes --json, or is listed here.
NO_RESULT = {
    (): "the tool itself: its commands report",
    ("data",): "a group: its commands report",
    ("local",): "a group: its commands report",
    ("runs",): "a group: its commands report",
    ("local", "up"): "runs until stopped, printing what reaches the team as it comes; where the stack is, as "
    "JSON, is the record it writes for other terminals (LocalStackRecord, the path it prints)",
    ("plan-job",): "its result is JSON already: the CreateTrainingJob request, alone on stdout",
}


@pytest.mark.parametrize("path", COMMANDS, ids=lambda path: " ".join(path) or "retrain")
def test_every_command_that_reports_a_result_takes_json(path: tuple[str, ...]) -> None:
    options = _options(path)
    if path in NO_RESULT:
        assert "--json" not in options, f"{' '.join(path)} takes --json now: take it off NO_RESULT"
    else:
        assert "--json" in options, (
            f"retrain {' '.join(path)} reports a result: give it --json, or list it in NO_RESULT"
        )
        assert not options["--json"].hidden
        # One JSON document, as JsonOption says; `validate` alone prints one per item, as it checks them.
        assert options["--json"].help == "One JSON document on stdout." or path == ("validate",)


def test_every_command_listed_is_one() -> None:
    listed = set(NO_RESULT)
    assert listed <= set(COMMANDS), f"not commands: {listed - set(COMMANDS)}"
