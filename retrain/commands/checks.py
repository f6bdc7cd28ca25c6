"""Argument checks several commands share, made before a command creates, deletes or starts anything.

A wrong value is a usage error: one line that names the option, exit 2 (click's `BadParameter`).
`tests/unit/test_cli_checks_first.py` holds every command to it.
"""

from __future__ import annotations

import math
from pathlib import Path

import typer
from pydantic import TypeAdapter, ValidationError

from functions.common.models import DatasetVersion, RunName


def finite(value: float | None) -> float | None:
    """A float option's callback: `nan` and `inf` parse as floats, and `nan` passes every `min`
    and `max` click checks (any comparison with nan is false)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


def positive(value: float | None) -> float | None:
    """A float option's callback: a finite number above 0 (a rate, a duration)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"{value} is not a finite number above 0")
    return value


def folder_to_write(path: Path, hint: str) -> None:
    """`path` may be made (or is) a folder: it is no file, and no file stands where a folder above it must."""
    if path.exists() and not path.is_dir():
        raise typer.BadParameter(f"{path} is a file, not a folder", param_hint=hint)
    above = next(parent for parent in path.absolute().parents if parent.exists())
    if not above.is_dir():
        raise typer.BadParameter(f"{path} cannot be made: {above} is a file, not a folder", param_hint=hint)


_EXECUTION_NAME_RULE = '1-80 characters, no spaces or <>{}[]?*"#%\\^|~`$&,;:/'


def dataset_version(value: str | None) -> str | None:
    """A `--dataset-version` callback: a name a run can carry (it names the run's execution and
    the manifest's file, so a `/` would put the manifest in another folder)."""
    if value is not None:
        try:
            TypeAdapter(DatasetVersion).validate_python(value)
        except ValidationError:
            raise typer.BadParameter(f"{value!r} is not a dataset version ({_EXECUTION_NAME_RULE})") from None
    return value


def run_name(value: str) -> str:
    """A RUN argument's callback: an execution's name, as `retrain runs list` shows it."""
    try:
        TypeAdapter(RunName).validate_python(value)
    except ValidationError:
        raise typer.BadParameter(f"{value!r} is not a run's name ({_EXECUTION_NAME_RULE})") from None
    return value
