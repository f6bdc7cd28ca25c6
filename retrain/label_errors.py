"""Label errors as annotation work makes them, applied to a correct train-id mask.

Each function takes a label (H x W, uint8 train ids, 255 = ignore) and returns a new, corrupted
one; the input is never changed. They stand for the ways real exports go wrong:

- `swap_classes`: a wrong class map in the annotation tool or the export script. Every pixel of a
  class is written as another (road as sidewalk, car as truck); the outlines stay perfect.
- `shift`: a misregistered export, e.g. a crop or padding applied to the image but not the mask.
  The whole mask sits a few pixels to the side of what it describes.
- `coarsen`: coarse polygons, as from a rushed annotator or a tool exporting at low resolution.
  Outlines turn blocky, and thin things (poles, signs, distant people) vanish into their
  background or grow into blocks.
- `sloppy`: boundaries drawn a pixel or two off, as a hurried annotator's polygon vertices are.
  Interiors stay right; only a narrow band along each boundary changes.

Randomness, where there is any, comes from the `numpy.random.Generator` passed in, so the same seed
gives the same corruption.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from functions.common.taxonomy import IGNORE_INDEX
from retrain.synth import class_remap

Label = npt.NDArray[np.uint8]

# Side of the square cells over which `sloppy` keeps one offset: a polygon edge drawn off by a
# pixel stays off by that pixel for a stretch, not independently at every pixel.
_SLOPPY_CELL = 8


def swap_classes(label: Label, mapping: dict[str, str]) -> Label:
    """Every pixel of class `a` written as `mapping[a]` (class names); the others kept.

    The mapping applies at once, so {"road": "sidewalk", "sidewalk": "road"} exchanges the two.
    """
    result: Label = class_remap(mapping)[_checked(label)]
    return result


def shift(label: Label, fraction: float) -> Label:
    """The mask moved right by `round(fraction * width)` pixels; the columns it left are ignore.

    A negative fraction moves it left (the columns on the right become ignore).
    """
    label = _checked(label)
    width = label.shape[1]
    pixels = round(fraction * width)
    moved = np.full_like(label, IGNORE_INDEX)
    if abs(pixels) >= width:
        return moved
    if pixels >= 0:
        moved[:, pixels:] = label[:, : width - pixels]
    else:
        moved[:, :pixels] = label[:, -pixels:]
    return moved


def coarsen(label: Label, block: int) -> Label:
    """Each `block` x `block` tile painted with its most frequent class, ignore not counted.

    A tile with nothing but ignore stays ignore; ties go to the lower class id. Tiles at the right
    and bottom edges may be smaller than `block`.
    """
    label = _checked(label)
    if block < 1:
        raise ValueError(f"block must be at least 1, got {block}")
    known = label[label != IGNORE_INDEX]
    if not known.size:
        return label.copy()
    height, width = label.shape
    rows, cols = -(-height // block), -(-width // block)
    padded = np.full((rows * block, cols * block), IGNORE_INDEX, dtype=np.uint8)
    padded[:height, :width] = label
    tiles = padded.reshape(rows, block, cols, block).transpose(0, 2, 1, 3).reshape(rows * cols, block * block)
    # One bincount counts every tile: tile t owns bins t * classes up to (t + 1) * classes - 1, the
    # last of them for ignore, which is dropped before the vote.
    classes = int(known.max()) + 2
    votes = np.where(tiles == IGNORE_INDEX, classes - 1, tiles).astype(np.int64)
    votes += np.arange(rows * cols, dtype=np.int64)[:, None] * classes
    counts = np.bincount(votes.ravel(), minlength=rows * cols * classes).reshape(rows * cols, classes)[:, :-1]
    winners = np.where(counts.any(axis=1), counts.argmax(axis=1), IGNORE_INDEX).astype(np.uint8)
    blocky = np.repeat(np.repeat(winners.reshape(rows, cols), block, axis=0), block, axis=1)
    return np.ascontiguousarray(blocky[:height, :width])


def sloppy(label: Label, rng: np.random.Generator, max_pixels: int = 2) -> Label:
    """Boundaries moved by up to `max_pixels` in x and y, differently along their length.

    Each pixel takes the class found `(dy, dx)` away, with the offset drawn per 8 x 8 cell (clipped
    at the image border). A pixel can only change if another class lies within `max_pixels` of it
    in both directions, so interiors stay exact.
    """
    label = _checked(label)
    if max_pixels < 0:
        raise ValueError(f"max_pixels must be at least 0, got {max_pixels}")
    height, width = label.shape
    dy = _cell_offsets(rng, label.shape, max_pixels)
    dx = _cell_offsets(rng, label.shape, max_pixels)
    ys = np.clip(np.arange(height)[:, None] + dy, 0, height - 1)
    xs = np.clip(np.arange(width)[None, :] + dx, 0, width - 1)
    result: Label = label[ys, xs]
    return result


def _cell_offsets(rng: np.random.Generator, shape: tuple[int, ...], max_pixels: int) -> npt.NDArray[np.int64]:
    """Integer offsets in [-max_pixels, max_pixels], one per cell, spread over the cell's pixels."""
    height, width = shape
    cells = rng.integers(-max_pixels, max_pixels + 1, size=(-(-height // _SLOPPY_CELL), -(-width // _SLOPPY_CELL)))
    return np.repeat(np.repeat(cells, _SLOPPY_CELL, axis=0), _SLOPPY_CELL, axis=1)[:height, :width]


def _checked(label: Label) -> Label:
    label = np.asarray(label)
    if label.ndim != 2 or label.dtype != np.uint8:
        raise ValueError(f"a label is an H x W uint8 array of train ids, got {label.dtype} {label.shape}")
    return label
