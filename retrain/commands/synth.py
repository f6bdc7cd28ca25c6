"""`retrain synth OUT --count N --size WxH --seed S`: synthetic driving scenes with exact masks.

`--json` prints what was drawn as one document (`Drawn`: the folder, the manifest, the dataset
version, scenes per split).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from functions.common.contracts import parse_manifest
from retrain.commands import checks
from retrain.commands.extras import require
from retrain.commands.options import JsonOption, print_json

_SIZE = re.compile(r"^(\d+)x(\d+)$")
# The smallest street `retrain.synth.write_scenes` draws (it refuses smaller itself, but only after
# numpy is imported and, in `retrain local demo`, the offline stack started).
MIN_SIZE = (32, 16)


@dataclass(frozen=True)
class Drawn:
    """What `retrain synth` wrote."""

    out: Path
    manifest: Path  # out/manifests/<dataset_version>.jsonl
    dataset_version: str
    scenes: int
    train: int  # scenes in the training split, by the manifest
    val: int
    width: int
    height: int
    seed: int
    seconds: float


def parse_size(text: str, minimum: tuple[int, int] = MIN_SIZE) -> tuple[int, int]:
    """`WxH` (e.g. `256x128`) as (width, height), at least `minimum` and at most what the intake
    accepts: a usage error (exit 2) otherwise."""
    match = _SIZE.match(text.strip().lower())
    if match is None:
        raise typer.BadParameter(f"expected WIDTHxHEIGHT such as 256x128, got {text!r}", param_hint="--size")
    width, height = int(match.group(1)), int(match.group(2))
    if width < minimum[0] or height < minimum[1]:
        raise typer.BadParameter(
            f"{width}x{height} is below the minimum of {minimum[0]}x{minimum[1]}", param_hint="--size"
        )
    # Larger scenes than the intake accepts would only be refused there, after minutes and
    # gigabytes of drawing here.
    from functions.validation import DEFAULT_CONFIG as LIMITS  # noqa: PLC0415 (Pillow: not for `retrain --help`)

    if width > LIMITS.max_width or height > LIMITS.max_height:
        raise typer.BadParameter(
            f"{width}x{height} is above the maximum of {LIMITS.max_width}x{LIMITS.max_height} the intake accepts",
            param_hint="--size",
        )
    if width * height > LIMITS.max_pixels:
        raise typer.BadParameter(
            f"{width}x{height} is {width * height} pixels, above the {LIMITS.max_pixels} the intake accepts",
            param_hint="--size",
        )
    return width, height


def command(
    out: Annotated[Path, typer.Argument(help="Folder to write images/, labels/, manifests/ into.")],
    *,
    count: Annotated[int, typer.Option(min=1, help="How many scenes to draw.")] = 320,
    size: Annotated[str, typer.Option(help="Scene size as WIDTHxHEIGHT.")] = "128x64",
    seed: Annotated[int, typer.Option(help="Same seed, same scenes, byte for byte.")] = 0,
    val_fraction: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of scenes in the validation split.")
    ] = 0.2,
    dataset_version: Annotated[
        str | None,
        typer.Option(
            callback=checks.dataset_version,
            help="Dataset version (manifest name); derived if omitted.",
            show_default=False,
        ),
    ] = None,
    # The name this option had: `retrain --version` is the tool's, `plan-job` and the trainer say --dataset-version.
    version: Annotated[
        str | None, typer.Option(hidden=True, callback=checks.dataset_version, help="Old name of --dataset-version.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Draw procedural street scenes (Cityscapes train ids) and a manifest, as the trainer reads.

    The defaults are the offline run's data set: `retrain train OUT` then learns it to an mIoU
    above 0.5 in about a minute on two cores."""
    width, height = parse_size(size)
    checks.folder_to_write(out, "OUT")
    require("trainer", "synth", modules=("numpy",))
    from retrain.synth import default_version, write_scenes  # noqa: PLC0415 (numpy: not for `retrain --help`)

    version = dataset_version or version or default_version(seed, count, (width, height))
    started = time.perf_counter()
    pairs = write_scenes(
        out,
        count=count,
        size=(width, height),
        seed=seed,
        val_fraction=val_fraction,
        version=version,
    )
    seconds = time.perf_counter() - started
    manifest = out / "manifests" / f"{version}.jsonl"
    splits = [entry.split for entry in parse_manifest(manifest.read_text(encoding="utf-8"))]
    drawn = Drawn(
        out=out,
        manifest=manifest,
        dataset_version=version,
        scenes=len(pairs),
        train=splits.count("train"),
        val=splits.count("val"),
        width=width,
        height=height,
        seed=seed,
        seconds=seconds,
    )
    # Under --json the words go to stderr: stdout carries the document alone.
    Console(stderr=as_json).print(
        f"wrote {drawn.scenes} scenes of {width}x{height} to {out} in {seconds:.2f} s; manifest {manifest}",
        soft_wrap=True,
    )
    if as_json:
        print_json(drawn)
