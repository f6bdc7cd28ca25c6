"""`retrain train DATA_DIR`: the SageMaker trainer, run locally under torchrun (gloo, CPU).

It runs exactly what a training job runs (`torchrun -m trainer.train`), with the container's
`SM_*` variables pointed into `--out`, streams the rank-0 log with a progress bar, and leaves in
`--out`: `model/model.pt`, `model/metrics.json`, `output/metrics.json`, `checkpoints/` and
`logs/train.log`. The defaults are the offline run's configuration: small, CPU-sized, and enough
for BiSeNetV2 to learn the synthetic scenes of `retrain synth`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from PIL import Image
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from functions.common.contracts import MetricsFile, parse_manifest

# Typer settings for this command: flags it does not know go to the trainer unchanged.
CONTEXT_SETTINGS: dict[str, Any] = {"allow_extra_args": True, "ignore_unknown_options": True}
PROJECT_ROOT = Path(__file__).resolve().parents[2]


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
    candidates = sorted((data / "manifests").glob("*.jsonl"), key=lambda p: (p.stat().st_mtime, p.name))
    if not candidates:
        raise typer.BadParameter(f"{data} has no manifests/*.jsonl; run `retrain synth` first?")
    return data.resolve(), candidates[-1].resolve()


def image_size(data_dir: Path, manifest: Path) -> str:
    """The size of the dataset's first image, as WIDTHxHEIGHT: the default crop."""
    entries = parse_manifest(manifest.read_text())
    if not entries:
        raise typer.BadParameter(f"{manifest} is empty")
    with Image.open(data_dir / entries[0].image) as image:
        return f"{image.width}x{image.height}"


def trainer_command(
    *,
    nproc: int,
    data_dir: Path,
    manifest: Path,
    out: Path,
    trainer_args: list[str],
) -> list[str]:
    """The torchrun command line, as SageMaker's `torch_distributed` launcher would build it."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "trainer.train",
        "--data-dir",
        str(data_dir),
        "--manifest",
        str(manifest.relative_to(data_dir)),
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
    data: Annotated[Path, typer.Argument(help="A folder with manifests/ (newest used) or a manifest.")],
    *,
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the training split.")] = 24,
    nproc: Annotated[int, typer.Option(min=1, help="Processes (gloo ranks), one per core.")] = 2,
    out: Annotated[Path, typer.Option(help="Where the model, metrics, checkpoints and logs go.")] = Path("runs/train"),
    width: Annotated[float, typer.Option(min=0.05, help="BiSeNetV2 width multiplier.")] = 0.25,
    manifest: Annotated[str | None, typer.Option(help="Manifest relative to DATA (default: the newest).")] = None,
    crop: Annotated[str | None, typer.Option(help="Training crop WIDTHxHEIGHT (default: the image size).")] = None,
    batch_size: Annotated[int, typer.Option(min=2, help="Images per process per step.")] = 4,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 0.1,
    seed: Annotated[int, typer.Option(help="Seed of the run.")] = 0,
    resume: Annotated[
        bool, typer.Option(help="Continue from checkpoints left in OUT instead of starting over.")
    ] = False,
) -> None:
    """Train BiSeNetV2 under torchrun on CPU, as the SageMaker job would.

    Flags this command does not know (e.g. --baseline-model runs/old/model/model.pt) go to the
    trainer unchanged; `python -m trainer.train --help` lists them.
    """
    console = Console()
    data_dir, manifest_path = resolve_manifest(data, manifest)
    if not manifest_path.is_file():
        raise typer.BadParameter(f"no manifest at {manifest_path}")
    out = out.resolve()
    if not resume:
        # Otherwise the trainer would resume from the last run's checkpoints, by design.
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
    for folder in ("model", "output", "checkpoints", "logs"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    trainer_args = [
        "--epochs",
        str(epochs),
        "--width",
        str(width),
        "--crop",
        crop or image_size(data_dir, manifest_path),
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
        *ctx.args,
    ]
    argv = trainer_command(nproc=nproc, data_dir=data_dir, manifest=manifest_path, out=out, trainer_args=trainer_args)
    console.print(f"[bold]training[/] on {manifest_path.name} with {nproc} processes -> {out}")
    console.print(" ".join(argv[1:]), style="dim", soft_wrap=True)

    started = time.perf_counter()
    returncode = _stream(argv, trainer_environment(out, data_dir), out / "logs" / "train.log", epochs)
    seconds = time.perf_counter() - started
    if returncode != 0:
        console.print(f"[red]training failed[/] (exit {returncode}); log: {out / 'logs' / 'train.log'}")
        raise typer.Exit(returncode)
    _summary(console, out, seconds)


def _stream(argv: list[str], env: dict[str, str], log_path: Path, epochs: int) -> int:
    """Run the trainer, tee its output to the log, show METRIC lines and an epoch progress bar."""
    console = Console()
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
        return process.wait()


def _summary(console: Console, out: Path, seconds: float) -> None:
    metrics = MetricsFile.model_validate_json((out / "output" / "metrics.json").read_text())
    table = Table(title=f"mIoU {metrics.miou:.4f} after {len(metrics.epochs)} epochs, {seconds:.0f} s")
    table.add_column("class")
    table.add_column("IoU", justify="right")
    for name, iou in metrics.per_class_iou.items():
        if iou is not None:
            table.add_row(name, f"{iou:.3f}")
    console.print(table)
    console.print(f"model: {out / 'model' / 'model.pt'}")
    console.print(f"metrics: {out / 'output' / 'metrics.json'}; log: {out / 'logs' / 'train.log'}")
