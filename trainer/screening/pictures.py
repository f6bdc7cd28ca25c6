"""Pictures of the pairs a screening found wrong, for the people who fix them.

For the worst pairs of each batch with something to fix (held, left out, disputed or contradicted
but released): the image, its label, the accepted model's prediction and the disagreement (red,
where the model confidently sees another class), side by side, one small PNG each, under
`screening/<batch>/<n>.png`. The run's report embeds them; the evaluation copies them beside the
batch's own report, as its relabel list's thumbnails.

The images show people and number plates, and the pictures leave the protected prefixes (the
report goes out as a link): `--held-pair-pictures` (the template's HeldPairPictures) says what is
written. `blur` (the default) leaves the image and disagreement panels too coarse for a face or a
plate to be read, the label and prediction panels sharp: the team still sees where the labels are
wrong and opens the image itself from its own copy. `show` writes them as they are; `omit` writes
none, and the report and the messages say so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch
from PIL import Image

from trainer.data import Entry, SegmentationDataset
from trainer.screening.rule import IGNORE_INDEX, Calibration

Probabilities = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

# The official Cityscapes colours of the train ids (functions/common/taxonomy.py has the same;
# the trainer imports nothing from functions/, and tests/trainer/test_screening.py checks they agree).
CITYSCAPES_COLORS: tuple[tuple[int, int, int], ...] = (
    (128, 64, 128), (244, 35, 232), (70, 70, 70), (102, 102, 156), (190, 153, 153),
    (153, 153, 153), (250, 170, 30), (220, 220, 0), (107, 142, 35), (152, 251, 152),
    (70, 130, 180), (220, 20, 60), (255, 0, 0), (0, 0, 142), (0, 0, 70),
    (0, 60, 100), (0, 80, 100), (0, 0, 230), (119, 11, 32),
)  # fmt: skip
PICTURE_WIDTH = 192  # each of the four panels
TO_FIX = ("held", "left out", "released", "disputed")
PictureMode = Literal["blur", "show", "omit"]
PICTURE_MODES: tuple[str, ...] = get_args(PictureMode)
# A blurred panel keeps this many cells across: each is 1/12 of the scene's width (about 170
# pixels of a 2048-pixel Cityscapes frame), wider than a face or a number plate in a driving scene.
BLUR_CELLS = 12


def write(
    probabilities: Probabilities,
    dataset: SegmentationDataset,
    entries: Sequence[Entry],
    batches: dict[str, dict[str, Any]],
    calibration: Calibration,
    *,
    folder: Path,
    per_batch: int,
    mode: PictureMode = "blur",
) -> None:
    """Rank 0: the worst `per_batch` pairs of each batch with something to fix, pictured with the
    model's `probabilities` (blurred, or as they are: `mode`); each such pair's record in `batches`
    gains its `picture` (relative to the output folder), None when `mode` is omit."""
    by_image = {entry.image: index for index, entry in enumerate(entries)}
    for name, batch in batches.items():
        wrong = batch["verdict"] != "ok" or any(p["contradicted"] for p in batch["pairs"])
        if not wrong:
            continue
        # A batch not judged is pictured too: people see what the model could not.
        shown = (*TO_FIX, "not judged") if batch["verdict"] == "not judged" else TO_FIX
        worst = [p for p in batch["pairs"] if p["contradicted"] or p["verdict"] in shown][:per_batch]
        for number, pair in enumerate(worst, start=1):
            if mode == "omit":
                pair["picture"] = None  # one of the worst, named in the report, not pictured
                continue
            raw_image, raw_label = dataset[by_image[pair["image"]]]
            probs, labels = probabilities(raw_image.unsqueeze(0), raw_label.unsqueeze(0))
            confidence, predicted = probs[0].max(dim=0)
            sure = (confidence >= calibration.thresholds.to(confidence)[predicted]) & calibration.judged.to(
                predicted.device
            )[predicted]
            flagged = sure & (predicted != labels[0]) & (labels[0] != IGNORE_INDEX)
            path = folder / name / f"{number}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            side_by_side(raw_image, labels[0], predicted, flagged, blur=mode == "blur").save(path, optimize=True)
            pair["picture"] = f"screening/{name}/{number}.png"


def side_by_side(
    raw_image: torch.Tensor,
    labels: torch.Tensor,
    predicted: torch.Tensor,
    flagged: torch.Tensor,
    *,
    blur: bool = True,
) -> Image.Image:
    height = max(1, round(PICTURE_WIDTH * labels.shape[0] / labels.shape[1]))
    size = (PICTURE_WIDTH, height)
    palette = np.zeros((256, 3), dtype=np.uint8)
    palette[: len(CITYSCAPES_COLORS)] = CITYSCAPES_COLORS
    image = Image.fromarray(raw_image.permute(1, 2, 0).numpy()).resize(size, Image.Resampling.BILINEAR)
    if blur:
        # The disagreement panel is made from this one, so it is blurred too.
        image = unreadable(image)
    label = Image.fromarray(palette[labels.cpu().numpy().astype(np.uint8)]).resize(size, Image.Resampling.NEAREST)
    guess = Image.fromarray(palette[predicted.cpu().numpy().astype(np.uint8)]).resize(size, Image.Resampling.NEAREST)
    grey = np.asarray(image.convert("L").convert("RGB"), dtype=np.uint8).copy()
    mask = np.asarray(Image.fromarray(flagged.cpu().numpy().astype(np.uint8) * 255).resize(size)) > 127
    grey[mask] = (230, 30, 30)
    canvas = Image.new("RGB", (PICTURE_WIDTH * 4 + 6, height), (255, 255, 255))
    for column, panel in enumerate((image, label, guess, Image.fromarray(grey))):
        canvas.paste(panel, (column * (PICTURE_WIDTH + 2), 0))
    return canvas


def unreadable(panel: Image.Image) -> Image.Image:
    """The panel averaged down to `BLUR_CELLS` cells across and smoothed back up: the scene's
    layout stays (road, sky, a car's place), no face or number plate can be read."""
    width, height = panel.size
    cells = (BLUR_CELLS, max(1, round(BLUR_CELLS * height / width)))
    return panel.resize(cells, Image.Resampling.BOX).resize(panel.size, Image.Resampling.BILINEAR)
