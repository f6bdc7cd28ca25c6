"""`retrain`: the command-line tool for the offline stack and the annotators' and engineers' checks.

Each command lives in its own module under `retrain/commands/`; this file only wires them up.
"""

from __future__ import annotations

import typer

from retrain.commands import local

app = typer.Typer(
    name="retrain",
    help="Retrain driving-scene segmentation models when labeled data lands in S3.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(local.app, name="local")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
