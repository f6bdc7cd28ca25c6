"""The trainer never crops larger than the largest image of the version it trains on: a 1024x512
crop of 256x128 scenes would be 94 % padding, compute spent on nothing (issue 25)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from PIL import Image

from retrain.synth import default_version, write_scenes
from trainer import build
from trainer.data import Entry
from trainer.train import get_args_parser


def _images(folder: Path, sizes: list[tuple[int, int]]) -> list[Entry]:
    entries = []
    for index, size in enumerate(sizes):
        name = f"images/{index}.png"
        (folder / "images").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", size).save(folder / name)
        entries.append(Entry(image=name, label=f"labels/{index}.png", split="train", image_sha256=""))
    return entries


def test_a_crop_larger_than_every_image_shrinks_to_the_largest_width_and_height(tmp_path: Path) -> None:
    entries = _images(tmp_path, [(256, 128), (200, 150), (240, 100)])
    assert build.fitted_crop((1024, 512), None, tmp_path, entries) == (256, 150)


def test_a_crop_that_some_image_covers_stays_and_only_that_far_is_read(tmp_path: Path) -> None:
    entries = _images(tmp_path, [(100, 50), (2048, 1024)])
    # A third entry whose file does not exist: the scan stopped at the image that covers the crop.
    entries.append(Entry(image="images/missing.png", label="labels/x.png", split="train", image_sha256=""))
    assert build.fitted_crop((1024, 512), None, tmp_path, entries) == (1024, 512)


def test_with_a_base_size_every_image_is_that_size(tmp_path: Path) -> None:
    assert build.fitted_crop((1024, 512), (512, 256), tmp_path, []) == (512, 256)
    assert build.fitted_crop((256, 128), (512, 256), tmp_path, []) == (256, 128)


def test_the_run_says_which_crop_it_uses_and_records_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_scenes(tmp_path, count=8, size=(64, 32), seed=1)
    manifest = f"manifests/{default_version(1, 8, (64, 32))}.jsonl"
    args = get_args_parser().parse_args(["--data-dir", str(tmp_path), "--manifest", manifest, "--crop", "1024x512"])
    with caplog.at_level(logging.INFO, logger="trainer"):
        train_set, _ = build.datasets(args, build.manifest_path(args))
    assert args.crop == "64x32", "metrics.json's config records the crop the run trained with"
    assert train_set.augment is not None and train_set.augment.crop == (64, 32)
    assert "crop 1024x512: no training image of this version is that large, so the crop is 64x32" in caplog.text
