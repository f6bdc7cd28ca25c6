"""A plain labeled folder becomes a manifest as the intake and the trigger would make it."""

from __future__ import annotations

import shutil
from pathlib import Path

from functions.common.contracts import parse_manifest, split_for
from functions.validation import ReasonCode, Status
from retrain import labeled
from retrain.synth import default_version, write_scenes

COUNT, SIZE, SEED = 24, (64, 32), 1
BROKEN = "s1-00003"


def plain_folder(root: Path, count: int = COUNT) -> Path:
    """`retrain synth` scenes moved into a bare images/ + labels/ folder (no manifests/), with one
    broken mask and one stray file: what an annotator's own export looks like."""
    synth = root / "synth"
    write_scenes(synth, count=count, size=SIZE, seed=SEED)
    folder = root / "drop-0425"
    folder.mkdir()
    for name in ("images", "labels"):
        shutil.move(synth / name, folder / name)
    (folder / "labels" / f"{BROKEN}.png").write_bytes(b"not a png at all")
    (folder / "notes.txt").write_text("annotator's notes, not data\n")
    return folder


def synth_entries(root: Path) -> dict[str, dict[str, object]]:
    """What `write_scenes` froze for the same pairs, by image path."""
    manifest = root / "synth" / "manifests" / f"{default_version(SEED, COUNT, SIZE)}.jsonl"
    return {entry.image: entry.model_dump() for entry in parse_manifest(manifest.read_text())}


def test_valid_pairs_become_entries_and_the_rest_is_left_out(tmp_path: Path) -> None:
    folder = plain_folder(tmp_path)
    dataset = labeled.build_manifest(folder)
    assert len(dataset.entries) == COUNT - 1
    assert not [entry for entry in dataset.entries if BROKEN in entry.image]
    reasons = {result.item: {reason.code for reason in result.reasons} for result in dataset.left_out}
    assert reasons == {BROKEN: {ReasonCode.NOT_AN_IMAGE}, "notes.txt": {ReasonCode.UNEXPECTED_FILE}}
    assert dataset.train + dataset.val == COUNT - 1 and dataset.val >= 1 and dataset.train >= 1

    # Field for field what the synthetic writer froze (it writes the trigger's shape), save the
    # batch (the folder's name) and the split (the trigger's val_fraction, 0.1).
    frozen = synth_entries(tmp_path)
    for entry in dataset.entries:
        assert entry.image.startswith("images/") and entry.label.startswith("labels/"), "relative to the folder"
        assert entry.batch == "drop-0425" and entry.image_version_id is None
        assert entry.split == split_for(entry.image_sha256, 0.1)
        expected = frozen[entry.image] | {"batch": "drop-0425", "split": entry.split}
        assert entry.model_dump() == expected


def test_a_second_copy_of_an_image_is_a_duplicate_as_at_the_intake(tmp_path: Path) -> None:
    folder = plain_folder(tmp_path)
    shutil.copy(folder / "images" / "s1-00000.jpg", folder / "images" / "zz-copy.jpg")
    shutil.copy(folder / "labels" / "s1-00000.png", folder / "labels" / "zz-copy.png")
    dataset = labeled.build_manifest(folder)
    [duplicate] = [result for result in dataset.left_out if result.item == "zz-copy"]
    assert duplicate.status is Status.DUPLICATE and duplicate.duplicate_of == "images/s1-00000.jpg"
    assert len(dataset.entries) == COUNT - 1


def test_the_split_follows_val_fraction_and_the_version_follows_the_content(tmp_path: Path) -> None:
    folder = plain_folder(tmp_path)
    planned = labeled.plan(folder)
    ticks: list[int] = []
    default = labeled.build_manifest(folder, planned=planned, advance=lambda: ticks.append(1))
    assert len(ticks) == len(planned) == COUNT + 1, "one tick per item: the progress bar's"
    assert labeled.build_manifest(folder).version == default.version, "same pairs, same version"
    half = labeled.build_manifest(folder, val_fraction=0.5)
    assert half.val > default.val and half.version != default.version
    (folder / "images" / f"{BROKEN}.jpg").unlink()
    (folder / "labels" / f"{BROKEN}.png").unlink()
    assert labeled.build_manifest(folder).version == default.version, "left-out items are not the dataset"
    (folder / "images" / "s1-00000.jpg").unlink()
    (folder / "labels" / "s1-00000.png").unlink()
    assert labeled.build_manifest(folder).version != default.version
    assert default.version.startswith("drop-0425-")


def test_a_runs_output_inside_the_folder_is_not_data(tmp_path: Path) -> None:
    folder = plain_folder(tmp_path)
    out = folder / "runs" / "train"
    (out / "logs").mkdir(parents=True)
    (out / "logs" / "train.log").write_text("a log")
    items = {item.item for item in labeled.plan(folder, exclude=out)}
    assert not [item for item in items if item.startswith("runs/")]
    assert "runs/train/logs/train.log" in {item.item for item in labeled.plan(folder)}


def test_the_layout_is_images_and_labels(tmp_path: Path) -> None:
    assert labeled.is_labeled_folder(plain_folder(tmp_path))
    (tmp_path / "only-images" / "images").mkdir(parents=True)
    assert not labeled.is_labeled_folder(tmp_path / "only-images")
