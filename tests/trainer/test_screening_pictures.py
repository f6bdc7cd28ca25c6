"""The pictures of the pairs to fix, as the stack's HeldPairPictures asks: blurred so that no face
or number plate can be read (the default), as they are, or not at all.

A held pair is pictured by the real `pictures.write` from a real image on disk; what each mode
writes is compared with what `show` writes.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from retrain.local.cloudformation.template import load_template
from trainer.data import Entry, SegmentationDataset
from trainer.flags import get_args_parser
from trainer.screening import pictures
from trainer.screening.phase import Settings
from trainer.screening.rule import Calibration

ROOT = Path(__file__).resolve().parents[2]
CLASSES = 3
IMAGE = "images/munich-1/scene-1.png"
PANEL = pictures.PICTURE_WIDTH


@pytest.fixture
def scene(tmp_path: Path) -> tuple[SegmentationDataset, list[Entry]]:
    """A 384x192 scene full of fine detail (what a face or a number plate is made of), labelled road
    (0) on top and sidewalk (1) below."""
    detail = np.random.default_rng(7).integers(0, 256, size=(192, 384, 3), dtype=np.uint8)
    label = np.zeros((192, 384), dtype=np.uint8)
    label[96:] = 1
    (tmp_path / "images/munich-1").mkdir(parents=True)
    (tmp_path / "labels/munich-1").mkdir(parents=True)
    Image.fromarray(detail).save(tmp_path / IMAGE)
    Image.fromarray(label).save(tmp_path / "labels/munich-1/scene-1.png")
    entry = Entry(image=IMAGE, label="labels/munich-1/scene-1.png", split="train", image_sha256="0" * 64)
    return SegmentationDataset(tmp_path, [entry]), [entry]


def sees_sidewalk_everywhere(image: torch.Tensor, label: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A model sure the whole scene is sidewalk: the road above is where it disagrees."""
    probs = torch.zeros(1, CLASSES, *label.shape[1:])
    probs[:, 1] = 1.0
    return probs, label.long()


CALIBRATION = Calibration(
    thresholds=torch.full((CLASSES,), 0.5, dtype=torch.float64),
    judged=torch.ones(CLASSES, dtype=torch.bool),
    iou=torch.ones(CLASSES, dtype=torch.float64),
    usual=torch.zeros(CLASSES, CLASSES, dtype=torch.float64),
    usual_miss=torch.zeros(CLASSES, dtype=torch.float64),
    coverage=1.0,
    pair_bar=0.04,
    pairs=1,
)
HELD = {"munich-1": {"verdict": "held", "pairs": [{"image": IMAGE, "verdict": "held", "contradicted": True}]}}


def picture(scene: tuple[SegmentationDataset, list[Entry]], folder: Path, mode: str) -> dict[str, Any]:
    """What `write` leaves in `folder` and in the batch records, in `mode`."""
    dataset, entries = scene
    batches = copy.deepcopy(HELD)
    pictures.write(
        sees_sidewalk_everywhere, dataset, entries, batches, CALIBRATION, folder=folder, per_batch=6, mode=mode
    )
    return batches["munich-1"]["pairs"][0]


def panels(path: Path) -> list[np.ndarray]:
    """The four panels of a picture (image, label, prediction, disagreement) as float arrays."""
    canvas = np.asarray(Image.open(path).convert("RGB"), dtype=np.float64)
    return [canvas[:, column * (PANEL + 2) : column * (PANEL + 2) + PANEL] for column in range(4)]


def fine_detail(panel: np.ndarray) -> float:
    """High-frequency energy: the mean squared difference between neighbouring pixels."""
    return float(np.mean(np.diff(panel, axis=0) ** 2) + np.mean(np.diff(panel, axis=1) ** 2))


def test_shown_pictures_are_the_image_as_it_is(scene: Any, tmp_path: Path) -> None:
    pair = picture(scene, tmp_path / "show", "show")

    assert pair["picture"] == "screening/munich-1/1.png"
    assert (tmp_path / "show" / "munich-1" / "1.png").is_file()


def test_blurred_pictures_keep_no_detail_a_face_or_plate_is_read_by(scene: Any, tmp_path: Path) -> None:
    shown = picture(scene, tmp_path / "show", "show")
    blurred = picture(scene, tmp_path / "blur", "blur")

    assert blurred["picture"] == shown["picture"], "pictured and linked as before"
    image, label, prediction, disagreement = panels(tmp_path / "blur" / "munich-1" / "1.png")
    original = panels(tmp_path / "show" / "munich-1" / "1.png")
    assert not np.array_equal(image, original[0])
    assert fine_detail(image) < 0.02 * fine_detail(original[0]), (fine_detail(image), fine_detail(original[0]))
    # Below the red (the road the model disputes) the disagreement panel is the grey image: blurred too.
    grey, grey_shown = disagreement[56:], original[3][56:]
    assert fine_detail(grey) < 0.02 * fine_detail(grey_shown), (fine_detail(grey), fine_detail(grey_shown))
    # What the team needs to see where the labels are wrong stays sharp.
    assert np.array_equal(label, original[1]) and np.array_equal(prediction, original[2])
    assert (disagreement[:40] == (230, 30, 30)).all(axis=-1).mean() > 0.9, "the road is still marked red"


def test_omitted_pictures_are_not_written_and_the_pair_is_still_named(scene: Any, tmp_path: Path) -> None:
    pair = picture(scene, tmp_path / "omit", "omit")

    assert "picture" in pair and pair["picture"] is None, "one of the worst pairs, named in the report"
    assert not (tmp_path / "omit").exists() or not any((tmp_path / "omit").rglob("*.png"))


def test_the_trainer_blurs_unless_told_otherwise_as_the_template_does() -> None:
    parameter = load_template(ROOT / "template.yaml").parameters["HeldPairPictures"]
    args = get_args_parser().parse_args(["--dataset-version", "v1"])

    assert parameter["Default"] == args.held_pair_pictures == Settings.picture_mode == "blur"
    assert sorted(parameter["AllowedValues"]) == sorted(pictures.PICTURE_MODES)
    with pytest.raises(SystemExit):
        get_args_parser().parse_args(["--dataset-version", "v1", "--held-pair-pictures", "faces"])
