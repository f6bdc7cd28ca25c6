"""`retrain validate DIR [--format cityscapes|groundtruth] [--json]`: check labels before upload.

The same checks the intake Lambda runs, on a local folder:

- `cityscapes` (default): DIR is one batch as it will land under `incoming/<batch>/`:
  `DIR/images/<stem>.{jpg,jpeg,png}`, `DIR/labels/<stem>.png`, optionally `DIR/_COMPLETE`.
- `groundtruth`: DIR is a Ground Truth output manifest, or a folder whose top level holds
  `*.manifest` files. Their `s3://bucket/key` locations are read from a local mirror,
  `SOURCE_ROOT/bucket/key` (`aws s3 sync s3://bucket SOURCE_ROOT/bucket` makes one); SOURCE_ROOT
  is `--source-root`, else the manifest's folder. Locations must be allowed by `--allow-source`
  or the config file's `allowed_sources`.

Exit codes: 0 every item valid, 1 any item not valid, 2 usage error.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NamedTuple

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from functions.common.prefixes import IMAGES_DIR, LABELS_DIR
from functions.validation import (
    InMemoryContentIndex,
    LocalBatchReader,
    LocalMirrorReader,
    PairResult,
    Status,
    ValidationConfig,
    plan_pairs,
    validate_manifest,
    validate_planned,
)

PROGRESS_MIN_ITEMS = 50  # below this a bar only flickers
MANIFEST_SUFFIX = ".manifest"
MANIFESTS_DIR = "manifests"  # a data set's manifests, beside images/ and labels/ (`retrain synth`, `retrain train`)


class InputFormat(StrEnum):
    CITYSCAPES = "cityscapes"
    GROUNDTRUTH = "groundtruth"


class Run(NamedTuple):
    """The items to validate: how many (for the progress bar) and their results, lazily."""

    total: int
    results: Iterator[PairResult]


def validate(
    directory: Annotated[
        Path,
        typer.Argument(exists=True, help="A batch folder (images/, labels/), or Ground Truth manifest(s)."),
    ],
    *,
    input_format: Annotated[
        InputFormat, typer.Option("--format", help="How DIR is laid out.")
    ] = InputFormat.CITYSCAPES,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per item on stdout, no table.")] = False,
    config_file: Annotated[
        Path | None,
        typer.Option("--config", exists=True, dir_okay=False, help="ValidationConfig as a JSON file."),
    ] = None,
    allow_source: Annotated[
        list[str] | None,
        typer.Option(help="groundtruth: an allowed s3://bucket/prefix/ (repeatable)."),
    ] = None,
    source_root: Annotated[
        Path | None,
        typer.Option(exists=True, file_okay=False, help="groundtruth: the mirror holding <bucket>/<key>."),
    ] = None,
) -> None:
    """Check every image/label pair and name every defect. Exit 0 all valid, 1 not, 2 usage."""
    config = load_config(config_file, allow_source or [])
    if input_format is InputFormat.CITYSCAPES:
        run = cityscapes_run(directory, config)
    else:
        run = groundtruth_run(directory, source_root, config)
    report = JsonReport() if as_json else TableReport()
    with progress(run.total) as advance:
        for result in run.results:
            report.add(result)
            advance()
    report.finish()
    raise typer.Exit(0 if report.all_valid else 1)


def load_config(config_file: Path | None, allow_source: list[str]) -> ValidationConfig:
    try:
        raw = config_file.read_text(encoding="utf-8") if config_file else "{}"
        config = ValidationConfig.model_validate_json(raw)
        if allow_source:
            allowed = (*config.allowed_sources, *allow_source)
            config = ValidationConfig.model_validate({**config.model_dump(), "allowed_sources": allowed})
    except (OSError, ValidationError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--config / --allow-source") from exc
    return config


def cityscapes_run(directory: Path, config: ValidationConfig) -> Run:
    if not directory.is_dir():
        raise typer.BadParameter(f"{directory} is not a folder", param_hint="DIR")
    if not any((directory / name).is_dir() for name in (IMAGES_DIR, LABELS_DIR)):
        raise typer.BadParameter(
            f"{directory} has neither {IMAGES_DIR}/ nor {LABELS_DIR}/: point DIR at one batch",
            param_hint="DIR",
        )
    reader = LocalBatchReader(directory)
    keys = reader.keys()
    manifests = [key for key in keys if is_dataset_manifest(key)]
    if manifests:
        # `retrain synth` and a dataset version's folder have them; the trainer reads them, a batch has none.
        Console(stderr=True, highlight=False).print(
            f"note: not checked: {len(manifests)} manifest(s) in {MANIFESTS_DIR}/ (a data set's, for `retrain "
            f"train`); a batch to upload is {IMAGES_DIR}/ and {LABELS_DIR}/ alone, where the intake would "
            f"reject {MANIFESTS_DIR}/ as unexpected_file",
            soft_wrap=True,
            markup=False,
        )
    planned = plan_pairs([key for key in keys if key not in manifests], config)
    if not planned:
        raise typer.BadParameter(f"{directory} holds no files to validate", param_hint="DIR")
    index = InMemoryContentIndex()
    results = (validate_planned(item, reader, config=config, index=index) for item in planned)
    return Run(len(planned), results)


def is_dataset_manifest(key: str) -> bool:
    """`manifests/<version>.jsonl` (and its `.purged.json`): what `retrain synth` writes beside the pairs."""
    folder, _, name = key.partition("/")
    return folder == MANIFESTS_DIR and "/" not in name and name.endswith((".jsonl", ".purged.json"))


def groundtruth_run(directory: Path, source_root: Path | None, config: ValidationConfig) -> Run:
    manifests = [directory] if directory.is_file() else sorted(directory.glob(f"*{MANIFEST_SUFFIX}"))
    if not manifests:
        raise typer.BadParameter(f"no *{MANIFEST_SUFFIX} file at the top of {directory}", param_hint="DIR")
    reader = LocalMirrorReader(source_root or manifests[0].parent)
    index = InMemoryContentIndex()
    # surrogateescape: a line that is not UTF-8 becomes an `unsafe_name`, not a crash.
    texts = {path: path.read_text("utf-8", "surrogateescape").splitlines() for path in manifests}
    total = sum(1 for lines in texts.values() for line in lines if line.strip())
    results = itertools.chain.from_iterable(
        validate_manifest(lines, path.name, reader, config=config, index=index) for path, lines in texts.items()
    )
    return Run(total, results)


@contextmanager
def progress(total: int) -> Iterator[Callable[[], None]]:
    """A progress bar on stderr (stdout stays clean for --json), only for large folders on a
    terminal; yields the function that advances it."""
    console = Console(stderr=True)
    bar = Progress(
        TextColumn("validating"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=total < PROGRESS_MIN_ITEMS or not console.is_terminal,
    )
    with bar:
        task = bar.add_task("validating", total=total)
        yield lambda: bar.advance(task)


class JsonReport:
    """One JSON object per item, written as soon as it is known."""

    def __init__(self) -> None:
        self.all_valid = True

    def add(self, result: PairResult) -> None:
        self.all_valid &= result.status is Status.VALID
        typer.echo(result.model_dump_json())

    def finish(self) -> None:
        pass


class TableReport:
    """A table of every item that is not valid, then a summary."""

    def __init__(self) -> None:
        self.all_valid = True
        self.statuses: Counter[Status] = Counter()
        self.codes: Counter[str] = Counter()
        self.table = Table("item", "status", "reason", "message", show_lines=False)

    def add(self, result: PairResult) -> None:
        self.statuses[result.status] += 1
        if result.status is Status.VALID:
            return
        self.all_valid = False
        for number, reason in enumerate(result.reasons):
            self.codes[reason.code] += 1
            # Text, not markup: a file may well be called `[red]boom.png`.
            item = Text(result.item if number == 0 else "")
            status = Text(result.status if number == 0 else "")
            self.table.add_row(item, status, Text(reason.code), Text(reason.message))

    def finish(self) -> None:
        console = Console()
        if self.table.row_count:
            console.print(self.table)
        counts = ", ".join(f"{self.statuses[status]} {status}" for status in Status)
        console.print(Text(f"{self.statuses.total()} items: {counts}"))
        if self.codes:
            shown = ", ".join(f"{code} {count}" for code, count in self.codes.most_common())
            console.print(Text(f"reasons: {shown}"))
