"""`retrain train DATA_DIR`: the SageMaker trainer, run locally under torchrun (gloo, CPU).

It runs exactly what a training job runs (`torchrun -m trainer.train`), with the container's
`SM_*` variables pointed into `--out`, streams the rank-0 log with a progress bar, and leaves in
`--out`: `model/model.pt`, `model/metrics.json`, `output/metrics.json`, `checkpoints/` and
`logs/train.log`. The defaults are the offline run's configuration: small, CPU-sized, and enough
for BiSeNetV2 to learn the synthetic scenes of `retrain synth`.

`--json` prints the finished run as one document (`Trained`: where the model, metrics, log and
checkpoints are, the items a labeled folder left out, and `metrics.json` whole); the progress,
the trainer's log and any error then go to stderr.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from PIL import Image
from pydantic import BaseModel
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from functions.common.contracts import ManifestEntry, MetricsFile, dump_manifest, parse_manifest
from functions.common.prefixes import IMAGES_DIR, LABELS_DIR
from functions.validation import PairResult
from retrain import labeled
from retrain.commands.checks import finite, folder_to_write
from retrain.commands.extras import require
from retrain.commands.options import JsonOption, print_json
from retrain.commands.validate import progress as validation_progress

# Typer settings for this command: flags it does not know go to the trainer unchanged.
CONTEXT_SETTINGS: dict[str, Any] = {"allow_extra_args": True, "ignore_unknown_options": True}
PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Where the manifest of a plain labeled folder goes, in --out: the run keeps what it trained on.
FOLDER_MANIFEST = "manifest.jsonl"
# Left-out items listed in full up to this many; `retrain validate` lists them all.
MAX_LISTED = 50


class Trained(BaseModel):
    """A finished `retrain train` run: where its files are, and its metrics."""

    out: Path
    model: Path  # out/model/model.pt
    metrics_file: Path  # out/output/metrics.json
    log: Path  # out/logs/train.log
    checkpoints: Path
    manifest: Path  # what it trained on
    dataset_version: str
    processes: int
    seconds: float
    left_out: list[PairResult]  # a labeled folder's items the intake would quarantine; [] for a manifest
    metrics: MetricsFile  # metrics.json: mIoU, per-class IoU, every epoch, lineage


def resolve_manifest(data: Path, manifest: str | None) -> tuple[Path, Path]:
    """(data folder, manifest) from a data folder or a manifest file.

    A folder without `--manifest` means its newest manifest: the dataset version frozen last.
    """
    if data.is_file():
        # <root>/manifests/<version>.jsonl: manifest paths are relative to <root>.
        return data.resolve().parent.parent, data.resolve()
    if manifest:
        path = Path(manifest)
        return data.resolve(), (path if path.is_absolute() else data / path).resolve()
    candidates = newest_manifests(data)
    if not candidates:
        raise typer.BadParameter(
            f"{data} is not a dataset: it has neither manifests/*.jsonl (a frozen version, as "
            f"`retrain synth` writes) nor {IMAGES_DIR}/ + {LABELS_DIR}/ (a labeled folder, as "
            "`retrain validate` checks it)"
        )
    return data.resolve(), candidates[-1].resolve()


def newest_manifests(data: Path) -> list[Path]:
    """The folder's manifests, oldest first (by modification time, then name)."""
    return sorted((data / "manifests").glob("*.jsonl"), key=lambda p: (p.stat().st_mtime, p.name))


def image_size(data_dir: Path, manifest: Path) -> str:
    """The size of the dataset's first image, as WIDTHxHEIGHT: the default crop."""
    try:
        entries = parse_manifest(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # not UTF-8, not JSON lines, not manifest entries
        raise typer.BadParameter(f"{manifest} is not a dataset manifest (JSON lines): {error}") from error
    if not entries:
        raise typer.BadParameter(f"{manifest} is empty")
    return first_image_size(data_dir, entries)


def first_image_size(data_dir: Path, entries: list[ManifestEntry]) -> str:
    try:
        with Image.open(data_dir / entries[0].image) as image:
            return f"{image.width}x{image.height}"
    except OSError as error:
        raise typer.BadParameter(f"cannot read {entries[0].image}, the manifest's first image: {error}") from error


def check_trainer_flags(argv: list[str]) -> None:
    """The flags the trainer will get, put through its own parser and checks here: a flag it
    refuses (unknown, or a value such as --crop abc) would otherwise stop it only after OUT's
    checkpoints were deleted. Exit 2 with the trainer's words."""
    from trainer import build, flags  # noqa: PLC0415 (torch: `retrain train` alone needs it)

    said = io.StringIO()
    try:
        # argparse prints its usage and the error, then exits: keep the error alone.
        with contextlib.redirect_stderr(said):
            args = flags.get_args_parser().parse_args(argv)
        build.check_args(args)
    except SystemExit as refused:
        lines = said.getvalue().strip().splitlines()
        reason = lines[-1].split("error: ", 1)[-1] if lines else str(refused.code)
        fail(f"the trainer refuses these flags: {reason}; nothing in the --out folder was touched")


def trainer_command(
    *,
    nproc: int,
    data_dir: Path,
    manifest: Path,
    out: Path,
    trainer_args: list[str],
) -> list[str]:
    """The torchrun command line, as SageMaker's `torch_distributed` launcher would build it.

    A manifest inside `data_dir` is passed relative to it, as on SageMaker; one elsewhere (a
    labeled folder's, kept in `out`) by its absolute path, which the trainer takes as it is.
    """
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "trainer.train",
        *trainer_flags(data_dir=data_dir, manifest=manifest, out=out, trainer_args=trainer_args),
    ]


def trainer_flags(*, data_dir: Path, manifest: Path, out: Path, trainer_args: list[str]) -> list[str]:
    """What `python -m trainer.train` gets: its folders in `out`, then `trainer_args`."""
    return [
        "--data-dir",
        str(data_dir),
        "--manifest",
        str(manifest.relative_to(data_dir) if manifest.is_relative_to(data_dir) else manifest),
        "--model-dir",
        str(out / "model"),
        "--output-data-dir",
        str(out / "output"),
        "--checkpoint-dir",
        str(out / "checkpoints"),
        *trainer_args,
    ]


def trainer_environment(out: Path, data_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "SM_CHANNEL_TRAIN": str(data_dir),
            "SM_MODEL_DIR": str(out / "model"),
            "SM_OUTPUT_DATA_DIR": str(out / "output"),
            # One thread per process: two processes on two cores beat one process with two threads.
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")])),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def command(
    ctx: typer.Context,
    data: Annotated[
        Path,
        typer.Argument(
            help="A folder with manifests/ (newest used), a manifest, or a labeled folder (images/ + labels/)."
        ),
    ],
    *,
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the training split.")] = 24,
    processes: Annotated[int, typer.Option(min=1, help="Processes (gloo ranks), one per core.")] = 2,
    # The name this option had; `retrain local demo` calls its training processes --processes too.
    nproc: Annotated[int | None, typer.Option(min=1, hidden=True, help="Old name of --processes.")] = None,
    out: Annotated[Path, typer.Option(help="Where the model, metrics, checkpoints and logs go.")] = Path("runs/train"),
    width: Annotated[float, typer.Option(min=0.05, callback=finite, help="BiSeNetV2 width multiplier.")] = 0.25,
    manifest: Annotated[str | None, typer.Option(help="Manifest relative to DATA (default: the newest).")] = None,
    crop: Annotated[str | None, typer.Option(help="Training crop WIDTHxHEIGHT (default: the image size).")] = None,
    batch_size: Annotated[int, typer.Option(min=2, help="Images per process per step.")] = 4,
    lr: Annotated[float, typer.Option(min=0.0, callback=finite, help="Peak learning rate.")] = 0.1,
    seed: Annotated[int, typer.Option(help="Seed of the run.")] = 0,
    resume: Annotated[
        bool, typer.Option(help="Continue from checkpoints left in OUT instead of starting over.")
    ] = False,
    val_fraction: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Labeled folder only: the share of pairs held out for validation, by content hash "
            f"(default {labeled.DEFAULT_VAL_FRACTION}, as the trigger).",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Train BiSeNetV2 under torchrun on CPU, as the SageMaker job would.

    Flags this command does not know (e.g. --baseline-model runs/old/model/model.pt) go to the
    trainer unchanged; `python -m trainer.train --help` lists them.

    A labeled folder (DATA/images/<stem>.jpg|png, DATA/labels/<stem>.png, no manifests/) is
    validated as the intake would, and its valid pairs frozen into OUT/manifest.jsonl as the
    trigger would; the pairs left out are listed.
    """
    require("trainer", "train")
    processes = processes if nproc is None else nproc
    # Under --json everything said goes to stderr: stdout carries the document alone.
    console = Console(stderr=as_json)
    # Every argument is checked before OUT is touched: a refused run must not cost the last
    # run's checkpoints (deleted below unless --resume).
    folder_to_write(out, "--out")
    out = out.resolve()
    dataset: labeled.FolderDataset | None = None
    if manifest is None and data.is_dir() and not newest_manifests(data) and labeled.is_labeled_folder(data):
        dataset = labeled_dataset(console, data, val_fraction, out)
        data_dir, manifest_path = data.resolve(), out / FOLDER_MANIFEST
        crop = crop or first_image_size(data_dir, dataset.entries)
    else:
        if val_fraction is not None:
            fail("--val-fraction is for a labeled folder (images/ + labels/): a manifest's splits are frozen in it")
        data_dir, manifest_path = resolve_manifest(data, manifest)
        if not manifest_path.is_file():
            raise typer.BadParameter(f"no manifest at {manifest_path}")
        # A file that is not a manifest stops here.
        crop = crop or image_size(data_dir, manifest_path)
    trainer_args = [
        "--epochs",
        str(epochs),
        "--width",
        str(width),
        "--crop",
        crop,
        "--batch-size",
        str(batch_size),
        "--lr",
        str(lr),
        "--seed",
        str(seed),
        # Offline-run settings: no loader workers (they would take cores from compute), gentler
        # scale jitter for small images, a progress line every few steps.
        "--workers",
        "0",
        "--scale-min",
        "0.75",
        "--scale-max",
        "1.5",
        "--log-every",
        "10",
        # A labeled folder's version is named after its content, not after the manifest's file.
        *(["--dataset-version", dataset.version] if dataset is not None else []),
        *ctx.args,
    ]
    check_trainer_flags(trainer_flags(data_dir=data_dir, manifest=manifest_path, out=out, trainer_args=trainer_args))
    argv = trainer_command(
        nproc=processes, data_dir=data_dir, manifest=manifest_path, out=out, trainer_args=trainer_args
    )
    if not resume:
        # Otherwise the trainer would resume from the last run's checkpoints, by design.
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
    for folder in ("model", "output", "checkpoints", "logs"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    if dataset is not None:
        manifest_path.write_text(dump_manifest(dataset.entries), encoding="utf-8")
    name = dataset.version if dataset is not None else manifest_path.name
    console.print(Text.assemble(("training", "bold"), f" on {name} with {processes} processes -> {out}"))
    console.print(" ".join(argv[1:]), style="dim", soft_wrap=True)

    started = time.perf_counter()
    returncode, stopped = _stream(console, argv, trainer_environment(out, data_dir), out / "logs" / "train.log", epochs)
    seconds = time.perf_counter() - started
    if returncode != 0 and stopped:
        console.print(
            f"[yellow]training stopped[/] with a checkpoint in {out / 'checkpoints'}; the same command with "
            f"--resume continues from it; log: {out / 'logs' / 'train.log'}"
        )
        raise typer.Exit(returncode)
    if returncode != 0:
        console.print(f"[red]training failed[/] (exit {returncode}); log: {out / 'logs' / 'train.log'}")
        raise typer.Exit(returncode)
    metrics = MetricsFile.model_validate_json((out / "output" / "metrics.json").read_text())
    trained = Trained(
        out=out,
        model=out / "model" / "model.pt",
        metrics_file=out / "output" / "metrics.json",
        log=out / "logs" / "train.log",
        checkpoints=out / "checkpoints",
        manifest=manifest_path,
        dataset_version=metrics.dataset_version,
        processes=processes,
        seconds=seconds,
        left_out=dataset.left_out if dataset is not None else [],
        metrics=metrics,
    )
    if as_json:
        print_json(trained)
    else:
        _summary(console, trained)


def labeled_dataset(console: Console, data: Path, val_fraction: float | None, out: Path) -> labeled.FolderDataset:
    """A labeled folder's valid pairs as a manifest; the rest listed; exit 2 if it cannot train."""
    fraction = labeled.DEFAULT_VAL_FRACTION if val_fraction is None else val_fraction
    if not 0.0 < fraction < 1.0:
        fail(f"--val-fraction {fraction} leaves a split empty: a run needs pairs to train on and to validate on")
    # A run's output inside the folder (`--out DATA/runs/x`) is not data: the next run would
    # list every checkpoint and log as a stray file.
    planned = labeled.plan(data, exclude=out)
    if not planned:
        fail(f"{data} has {IMAGES_DIR}/ and {LABELS_DIR}/ but no files in them: add image/label pairs")
    console.print(Text(f"validating {len(planned)} items of {data} as the intake would"), soft_wrap=True)
    with validation_progress(len(planned)) as advance:
        dataset = labeled.build_manifest(data, val_fraction=fraction, planned=planned, advance=advance)
    if dataset.left_out:
        console.print(left_out_table(dataset.left_out, data))
    used, total = len(dataset.entries), len(planned)
    if not used:
        fail(
            f"none of the {total} items of {data} is a valid pair (listed above; `retrain validate {data}` "
            "explains each): fix them or add valid image/label pairs"
        )
    if used < 2:
        fail(f"only 1 valid pair in {data}: a run needs a training and a validation pair at least; add pairs")
    if not dataset.val or not dataset.train:
        empty, other = ("validation", "training") if not dataset.val else ("training", "validation")
        change = "raise" if not dataset.val else "lower"
        fail(
            f"all {used} valid pairs fall in the {other} split and none in the {empty} split: each "
            f"pair's split comes from its image's content hash (--val-fraction {fraction}), so it "
            f"cannot be moved by hand; add pairs, or {change} --val-fraction"
        )
    console.print(
        Text(
            f"using {used} of {total} items: {dataset.train} train, {dataset.val} val (--val-fraction "
            f"{fraction}), dataset version {dataset.version}"
            + (f"; {len(dataset.left_out)} left out, as the intake would quarantine them" if dataset.left_out else "")
        ),
        soft_wrap=True,
    )
    return dataset


def left_out_table(results: list[PairResult], data: Path) -> Table:
    """One row per reason of every item left out (the first MAX_LISTED rows)."""
    rows = [
        # A missing partner's reason names no file: the file that is there is the one to show.
        (reason.key or result.image or result.label or result.item, reason.code, reason.message)
        for result in results
        for reason in result.reasons
    ]
    table = Table("file", "reason", "message", title=f"{len(results)} items left out", title_justify="left")
    for file, code, message in rows[:MAX_LISTED]:
        # Text, not markup: a file may well be called `[red]boom.png`.
        table.add_row(Text(file), Text(code), Text(message))
    if len(rows) > MAX_LISTED:
        table.caption = f"{len(rows) - MAX_LISTED} more: `retrain validate {data}` lists them all"
    return table


def fail(message: str) -> NoReturn:
    """An expected condition (a folder that cannot be trained on): one message on stderr, exit 2."""
    Console(stderr=True).print(Text.assemble(("error: ", "bold red"), message), soft_wrap=True)
    raise typer.Exit(2)


def _stream(console: Console, argv: list[str], env: dict[str, str], log_path: Path, epochs: int) -> tuple[int, bool]:
    """Run the trainer, tee its output to the log, show METRIC lines and an epoch progress bar.

    Ctrl-C reaches torchrun too, which forwards it to the trainer: that finishes its step, writes a
    checkpoint and exits (`trainer/stopping.py`), and its last lines are still shown. Returns the
    exit code, and whether the run was stopped so."""
    stopped = False
    with (
        log_path.open("w", encoding="utf-8") as log,
        Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} epochs"),
            TimeElapsedColumn(),
            console=console,
        ) as progress,
    ):
        task = progress.add_task("training", total=epochs)
        process = subprocess.Popen(  # noqa: S603 (our own interpreter and module)
            argv,
            cwd=PROJECT_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        assert process.stdout is not None
        while True:
            try:
                for line in process.stdout:
                    log.write(line)
                    log.flush()
                    text = line.rstrip("\n")
                    if "METRIC " in text:
                        progress.console.print(text, style="bold green", highlight=False, soft_wrap=True)
                        if " epoch=" in text:
                            progress.advance(task)
                    elif text:
                        progress.console.print(text, style="dim", highlight=False, markup=False, soft_wrap=True)
                return process.wait(), stopped
            except KeyboardInterrupt:
                if stopped:
                    # A second Ctrl-C: do not wait for the checkpoint.
                    process.kill()
                    raise
                stopped = True
                progress.console.print("stopping: the trainer finishes its step and checkpoints (Ctrl-C again to kill)")


def _summary(console: Console, trained: Trained) -> None:
    metrics = trained.metrics
    table = Table(title=f"mIoU {metrics.miou:.4f} after {len(metrics.epochs)} epochs, {trained.seconds:.0f} s")
    table.add_column("class")
    table.add_column("IoU", justify="right")
    for name, iou in metrics.per_class_iou.items():
        if iou is not None:
            table.add_row(name, f"{iou:.3f}")
    console.print(table)
    console.print(f"model: {trained.model}")
    console.print(f"metrics: {trained.metrics_file}; log: {trained.log}")
