"""An engineer without street-scene data draws synthetic scenes to train and test with."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

from functions.common.contracts import parse_manifest, split_for
from functions.common.taxonomy import CITYSCAPES_CLASSES, IGNORE_INDEX
from retrain.commands import synth as synth_command
from retrain.synth import default_version, write_scenes

# What the issue promises every batch of scenes shows somewhere.
PROMISED = (
    "road",
    "sidewalk",
    "building",
    "vegetation",
    "sky",
    "pole",
    "traffic sign",
    "car",
    "person",
)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_same_seed_draws_the_same_scenes_byte_for_byte(tmp_path: Path) -> None:
    write_scenes(tmp_path / "a", count=6, size=(128, 64), seed=7)
    write_scenes(tmp_path / "b", count=6, size=(128, 64), seed=7)
    write_scenes(tmp_path / "c", count=6, size=(128, 64), seed=8)

    first, again, other = _files(tmp_path / "a"), _files(tmp_path / "b"), _files(tmp_path / "c")
    assert first == again, "two runs with seed 7 wrote different files"
    first_images = {k: v for k, v in first.items() if k.startswith("images/")}
    other_images = {k: v for k, v in other.items() if k.startswith("images/")}
    assert set(first_images.values()).isdisjoint(other_images.values()), "seeds 7 and 8 drew an identical scene"


def test_a_scene_does_not_depend_on_how_many_are_drawn(tmp_path: Path) -> None:
    few = write_scenes(tmp_path / "few", count=2, size=(96, 48), seed=3)
    many = write_scenes(tmp_path / "many", count=5, size=(96, 48), seed=3)

    for (few_image, few_label), (many_image, many_label) in zip(few, many[:2], strict=True):
        assert few_image.read_bytes() == many_image.read_bytes(), f"{few_image.name} changed"
        assert few_label.read_bytes() == many_label.read_bytes(), f"{few_label.name} changed"


def test_labels_are_cityscapes_train_ids_covering_the_promised_classes(tmp_path: Path) -> None:
    pairs = write_scenes(tmp_path, count=24, size=(256, 128), seed=0)

    seen: set[int] = set()
    for image_path, label_path in pairs:
        image, label = Image.open(image_path), Image.open(label_path)
        assert image.mode == "RGB" and image.size == (256, 128), f"{image_path.name}: {image}"
        assert label.mode == "L" and label.size == image.size, f"{label_path.name}: {label}"
        values = set(np.unique(np.asarray(label)).tolist())
        invalid = values - set(range(len(CITYSCAPES_CLASSES))) - {IGNORE_INDEX}
        assert not invalid, f"{label_path.name} holds values that are no train id: {invalid}"
        seen |= values

    missing = [name for name in PROMISED if CITYSCAPES_CLASSES.index(name) not in seen]
    assert not missing, f"24 scenes never show {missing}"


def test_the_sky_is_above_the_road_in_every_scene(tmp_path: Path) -> None:
    sky, road = CITYSCAPES_CLASSES.index("sky"), CITYSCAPES_CLASSES.index("road")
    for _, label_path in write_scenes(tmp_path, count=12, size=(128, 64), seed=5):
        label = np.asarray(Image.open(label_path))
        sky_rows, road_rows = np.nonzero(label == sky)[0], np.nonzero(label == road)[0]
        assert sky_rows.size and road_rows.size, f"{label_path.name} lacks sky or road"
        assert sky_rows.max() <= road_rows.min() + 2, (
            f"{label_path.name}: sky reaches row {sky_rows.max()}, road starts at {road_rows.min()}"
        )


def test_the_manifest_pins_every_pair_as_the_trainer_reads_it(tmp_path: Path) -> None:
    pairs = write_scenes(tmp_path, count=40, size=(128, 64), seed=11, val_fraction=0.25)

    manifest = tmp_path / "manifests" / f"{default_version(11, 40, (128, 64))}.jsonl"
    entries = parse_manifest(manifest.read_text())
    assert len(entries) == len(pairs), f"{len(entries)} manifest lines for {len(pairs)} pairs"
    for entry, (image_path, label_path) in zip(entries, pairs, strict=True):
        assert (tmp_path / entry.image) == image_path and (tmp_path / entry.label) == label_path
        assert entry.image_sha256 == hashlib.sha256(image_path.read_bytes()).hexdigest()
        assert entry.label_sha256 == hashlib.sha256(label_path.read_bytes()).hexdigest()
        assert entry.split == split_for(entry.image_sha256, 0.25), f"{entry.image}: wrong split"
        counts = np.bincount(np.asarray(Image.open(label_path)).ravel(), minlength=256)
        expected = {str(i): int(counts[i]) for i in range(len(CITYSCAPES_CLASSES)) if counts[i]}
        assert entry.class_pixels == expected, f"{entry.label}: class_pixels disagree with the mask"
    splits = [entry.split for entry in entries]
    assert 0 < splits.count("val") < len(splits), f"40 scenes, splits {splits}: one side empty"
    # Plain JSON lines: the trainer reads them with json alone.
    first = json.loads(manifest.read_text().splitlines()[0])
    assert first["image_version_id"] is None and first["batch"] == "synth"


def test_sixty_four_scenes_take_well_under_two_seconds(tmp_path: Path) -> None:
    started = time.perf_counter()
    write_scenes(tmp_path, count=64, size=(256, 128), seed=0)
    seconds = time.perf_counter() - started
    assert seconds < 2.0, f"64 scenes at 256x128 took {seconds:.2f} s"


def test_the_synth_command_writes_the_folder_it_is_asked_for(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(synth_command.command)

    result = CliRunner().invoke(app, [str(tmp_path / "scenes"), "--count", "3", "--size", "64x32", "--seed", "2"])

    assert result.exit_code == 0, result.output
    assert len(list((tmp_path / "scenes" / "images").glob("*.jpg"))) == 3, result.output
    assert (tmp_path / "scenes" / "manifests" / "synth-64x32-n3-s2.jsonl").is_file()


def test_the_synth_command_json_names_the_folder_its_manifest_and_the_scenes_drawn(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(synth_command.command)
    out = tmp_path / "scenes"

    result = CliRunner().invoke(app, [str(out), "--count", "10", "--size", "64x32", "--seed", "2", "--json"])

    assert result.exit_code == 0, result.output
    drawn = json.loads(result.stdout)
    version = "synth-64x32-n10-s2"
    assert (drawn["out"], drawn["manifest"]) == (str(out), str(out / "manifests" / f"{version}.jsonl"))
    assert (drawn["dataset_version"], drawn["scenes"], drawn["width"], drawn["height"], drawn["seed"]) == (
        version,
        10,
        64,
        32,
        2,
    )
    assert drawn["train"] + drawn["val"] == 10 == len(list((out / "images").glob("*.jpg")))
    assert "wrote 10 scenes" in result.stderr, "the words go to stderr"


@pytest.mark.parametrize("text", ["64", "64x", "x32", "64*32", "-64x32"])
def test_a_size_that_is_not_width_x_height_is_refused(text: str) -> None:
    with pytest.raises(typer.BadParameter, match="WIDTHxHEIGHT"):
        synth_command.parse_size(text)


def test_too_small_a_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 32x16"):
        write_scenes(tmp_path, count=1, size=(16, 8), seed=0)
