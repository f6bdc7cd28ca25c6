"""`retrain`: the command-line tool for the offline stack and the annotators' and engineers' checks.

Each command lives in its own module under `retrain/commands/`; this file only wires them up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from retrain.commands import advise as advise_command
from retrain.commands import data as data_command
from retrain.commands import link as link_command
from retrain.commands import local
from retrain.commands import package as package_command
from retrain.commands import plan_job as plan_job_command
from retrain.commands import report as report_command
from retrain.commands import runs as runs_command
from retrain.commands import synth as synth_command
from retrain.commands import train as train_command
from retrain.commands import validate as validate_command

# `-h` as well as `--help`, on every command: subcommands' contexts inherit the names.
HELP = {"help_option_names": ["-h", "--help"]}
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

app = typer.Typer(
    name="retrain",
    help="Retrain driving-scene segmentation models when labeled data lands in S3.",
    no_args_is_help=True,
    add_completion=False,
    context_settings=HELP,
)


def version() -> str:
    """The installed distribution's version; in a checkout that is not installed, pyproject's."""
    import importlib.metadata  # noqa: PLC0415 (here: 20 ms that only --version needs)
    import tomllib  # noqa: PLC0415

    try:
        return importlib.metadata.version("retrain")
    except importlib.metadata.PackageNotFoundError:
        return str(tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["version"])


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"retrain {version()}")
        raise typer.Exit


@app.callback()
def _root(
    _version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Retrain driving-scene segmentation models when labeled data lands in S3."""


app.add_typer(local.app, name="local")
app.add_typer(data_command.app, name="data")
app.add_typer(runs_command.app, name="runs")
app.command(name="synth")(synth_command.command)
app.command(name="train", context_settings=train_command.CONTEXT_SETTINGS)(train_command.command)
app.command(name="validate")(validate_command.validate)
app.command(name="plan-job")(plan_job_command.command)
app.command(name="advise")(advise_command.command)
app.command(name="package-trainer")(package_command.command)
app.command(name="link")(link_command.command)
app.command(name="report")(report_command.command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
