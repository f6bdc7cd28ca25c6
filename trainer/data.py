"""The data a run trains on: a frozen manifest, decoded and augmented in loader workers.

Each sample is two whole-file reads (`decode.read_file`), the bytes read checked against the
manifest's sha256 (`checksums.py`; a pair that differs is skipped), a JPEG decode with the fastest decoder
present (`decode.ImageDecoder`) and a PNG decode, then augmentation: random scale, crop (padded
with ignore), flip and photometric jitter. The augmentation is *planned* before anything is
decoded (`Augment.plan`), so only the pixels the crop needs are resampled: Pillow's
`resize(box=...)` scales the source window straight to the crop, instead of scaling the whole
image (up to 4x its pixels at scale 2) and then cutting most of it away; and where the whole
image is needed at a fraction of its size (a `--base-size` below the files' size), the JPEG is
decoded at 1/2, 1/4 or 1/8 scale in the DCT domain. Workers hand over *uint8* CHW tensors; the
training loop moves them to the device and normalises there (`to_device`), where it is nearly
free and the inter-process copy is four times smaller than float32.

Randomness is keyed to (seed, epoch, sample), not to worker RNG state, so a sample gets the same
augmentation whichever worker decodes it and whether or not the run was resumed half-way.
"""

from __future__ import annotations

import functools
import json
import math
import random
from collections.abc import Iterator, Sequence, Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, Sampler

from trainer.checksums import CHECKED, IMAGE_DIFFERS, LABEL_DIFFERS, ChecksumTable, verdict
from trainer.decode import ImageDecoder, decode_label, image_size, read_file, reduction

IGNORE_INDEX = 255
# ImageNet statistics in 0-255 units: a conventional, harmless choice for a from-scratch net.
MEAN = (123.675, 116.28, 103.53)
STD = (58.395, 57.12, 57.375)
# Photometric jitter strength: brightness and contrast within 1 +- this, colour balance 1 +- 1/4.
DEFAULT_JITTER = 0.2

# A sample key: (index in the split, augmentation seed).
SampleKey = tuple[int, int]


@dataclass(frozen=True)
class Entry:
    """One manifest line, as much of it as the trainer needs."""

    image: str
    label: str
    split: str
    image_sha256: str
    # The digests that pin the files' bytes (lower-case hex); empty where the line has none.
    label_sha256: str = ""
    # Pixels per train id (keys are ids as strings, as JSON has them); empty if not recorded.
    class_pixels: dict[str, int] = field(default_factory=dict)
    # The drop it came in, and how far this pair's labels are trusted (`screening/verdicts.py`):
    # trusted, new, released or benchmark. A manifest without trust (a labelled folder) is all new.
    batch: str = ""
    trust: str = "new"
    # The annotation team that sent it ("" where the manifest does not say: its batch name's first part).
    team: str = ""


TRUSTS = ("trusted", "new", "released", "benchmark")


def read_manifest(path: Path) -> list[Entry]:
    """Every pair of a frozen dataset version. The manifest is the dataset: no folder is listed."""
    entries: list[Entry] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                entry = Entry(
                    image=str(record["image"]),
                    label=str(record["label"]),
                    split=str(record["split"]),
                    image_sha256=str(record.get("image_sha256", "")).lower(),
                    label_sha256=str(record.get("label_sha256", "")).lower(),
                    class_pixels={str(k): int(v) for k, v in record.get("class_pixels", {}).items()},
                    batch=str(record.get("batch") or ""),
                    trust=str(record.get("trust") or "new"),
                    team=str(record.get("team") or ""),
                )
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{path}:{number}: not a manifest entry ({error!r})") from error
            if entry.split not in {"train", "val"}:
                raise ValueError(f"{path}:{number}: split must be train or val, not {entry.split!r}")
            if entry.trust not in TRUSTS:
                raise ValueError(f"{path}:{number}: trust must be one of {', '.join(TRUSTS)}, not {entry.trust!r}")
            entries.append(entry)
    return entries


def class_weights(entries: Sequence[Entry], num_classes: int, power: float = 0.5) -> list[float]:
    """Loss weights that lift rare classes, from the manifest's pixel counts (no image is read).

    Median-frequency balancing (Eigen and Fergus, 2015), softened by `power` (0.5: square root) so
    that thin classes such as poles count more without drowning the large ones; classes absent
    from the training split get weight 1. Weights are scaled to average 1 over present classes.
    """
    totals = [0] * num_classes
    for entry in entries:
        for key, count in entry.class_pixels.items():
            if key.isdigit() and int(key) < num_classes:
                totals[int(key)] += count
    present = sorted(t for t in totals if t > 0)
    if not present:
        return [1.0] * num_classes
    median = present[len(present) // 2]
    raw = [(median / t) ** power if t > 0 else 0.0 for t in totals]
    mean = sum(raw) / len(present)
    return [w / mean if t > 0 else 1.0 for w, t in zip(raw, totals, strict=True)]


def parse_size(text: str) -> tuple[int, int]:
    """`WxH` or a single number (a square), as (width, height)."""
    width, _, height = text.lower().partition("x")
    try:
        size = (int(width), int(height or width))
    except ValueError:
        raise ValueError(f"expected WIDTHxHEIGHT or one number, got {text!r}") from None
    if min(size) < 1:
        raise ValueError(f"a size must be positive, got {text!r}")
    return size


Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class Placement:
    """Where one output sample comes from, decided before any pixel is decoded.

    `box` is the window of the image (in the coordinates of an image of `base` size) that is
    resampled to `size`, and lands at the top-left of an output of `out_size`; the rest of the
    output is padding (black pixels, ignore labels). Then an optional flip and, for the image
    only, a per-channel lookup table (photometric jitter).
    """

    base: tuple[int, int]
    box: Box
    size: tuple[int, int]
    out_size: tuple[int, int]
    flip: bool = False
    lut: tuple[int, ...] | None = None

    @property
    def scale(self) -> tuple[float, float]:
        """Output pixels per base pixel, along x and y."""
        left, top, right, bottom = self.box
        return self.size[0] / (right - left), self.size[1] / (bottom - top)

    def needed(self) -> tuple[int, int]:
        """The whole image's size, in pixels, at the crop's resolution: a decoder may reduce to
        this (but no further) and lose nothing the crop would have kept."""
        scale_x, scale_y = self.scale
        return max(1, round(self.base[0] * scale_x)), max(1, round(self.base[1] * scale_y))

    def render(self, image: Image.Image, fill: int, resample: Image.Resampling) -> Image.Image:
        """The window cut from `image` (of `base` size, or a reduction of it) and padded; not
        flipped (`apply` and `to_arrays` flip, each in the cheapest place)."""
        # A decoder that reduced in the DCT domain did so by a power of two: map exactly by it,
        # not by the rounded reduced size, so that image and label stay aligned to the pixel.
        factor = reduction(self.base, image.size)
        if factor is not None:
            sx = sy = 1.0 / factor
        else:
            sx, sy = image.width / self.base[0], image.height / self.base[1]
        left, top, right, bottom = self.box
        window = (left * sx, top * sy, right * sx, bottom * sy)
        if window == (0.0, 0.0, float(image.width), float(image.height)) and (image.size == self.size):
            out = image
        else:
            out = image.resize(self.size, resample, box=window)
        if self.size != self.out_size:
            padded = Image.new(out.mode, self.out_size, fill if out.mode == "L" else (fill,) * 3)
            padded.paste(out, (0, 0))
            out = padded
        return out


def whole(base: tuple[int, int]) -> Placement:
    """The whole image, at `base` size."""
    return Placement(base, (0.0, 0.0, float(base[0]), float(base[1])), base, base)


@dataclass(frozen=True)
class Augment:
    """Training augmentation: random scale, random crop (padded with ignore), horizontal flip,
    photometric jitter (brightness, contrast, colour balance; the image only)."""

    crop: tuple[int, int]  # (width, height)
    scale_min: float = 0.5
    scale_max: float = 2.0
    flip: bool = True
    jitter: float = DEFAULT_JITTER

    def plan(self, base: tuple[int, int], rng: random.Random) -> Placement:
        """Scale, crop window, flip and jitter for an image of `base` size, from `rng` alone."""
        scale = rng.uniform(self.scale_min, self.scale_max)
        scaled = (max(1, round(base[0] * scale)), max(1, round(base[1] * scale)))
        crop_w, crop_h = self.crop
        left = rng.randint(0, max(0, scaled[0] - crop_w))
        top = rng.randint(0, max(0, scaled[1] - crop_h))
        # The part of the crop the scaled image covers; the rest is padding.
        visible = (min(crop_w, scaled[0] - left), min(crop_h, scaled[1] - top))
        to_base = (base[0] / scaled[0], base[1] / scaled[1])
        box = (
            left * to_base[0],
            top * to_base[1],
            (left + visible[0]) * to_base[0],
            (top + visible[1]) * to_base[1],
        )
        flip = self.flip and rng.random() < 0.5
        return Placement(base, box, visible, self.crop, flip, self._lut(rng))

    def _lut(self, rng: random.Random) -> tuple[int, ...] | None:
        """One 256-entry table per channel: contrast about mid-grey, brightness, colour gain.

        A lookup table costs one pass over the crop's bytes (about 0.5 ms at 1024x512), where
        the same arithmetic on float arrays would cost several."""
        if self.jitter <= 0:
            return None
        brightness = rng.uniform(1 - self.jitter, 1 + self.jitter)
        contrast = rng.uniform(1 - self.jitter, 1 + self.jitter)
        gains = np.array([rng.uniform(1 - self.jitter / 4, 1 + self.jitter / 4) for _ in range(3)])
        values = np.arange(256, dtype=np.float64)
        table = ((values - 128) * contrast + 128) * brightness * gains[:, None]
        return tuple(np.clip(np.rint(table), 0, 255).astype(np.uint8).ravel().tolist())

    def __call__(self, image: Image.Image, label: Image.Image, rng: random.Random) -> tuple[Image.Image, Image.Image]:
        """Augment already decoded images (the dataset plans first and decodes less)."""
        placement = self.plan(image.size, rng)
        return apply(placement, image.convert("RGB"), label)


def apply(placement: Placement, image: Image.Image, label: Image.Image) -> tuple[Image.Image, Image.Image]:
    """The placement on both images, as images."""
    out_image, out_label = _cut(placement, image, label)
    if placement.flip:
        out_image = out_image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        out_label = out_label.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return out_image, out_label


def to_arrays(
    placement: Placement, image: Image.Image, label: Image.Image
) -> tuple[np.ndarray[Any, np.dtype[np.uint8]], np.ndarray[Any, np.dtype[np.uint8]]]:
    """The placement on both, as a CxHxW image array and an HxW label array.

    The copy out of Pillow is one band at a time (a band's bytes are contiguous, so each copy is
    a memcpy, twice as fast as `np.asarray` of the RGB image), and the flip rides along in it.
    """
    out_image, out_label = _cut(placement, image, label)
    columns = slice(None, None, -1 if placement.flip else 1)
    pixels = np.empty((3, out_image.height, out_image.width), dtype=np.uint8)
    for channel, band in enumerate(out_image.split()):
        pixels[channel] = np.asarray(band)[:, columns]
    return pixels, np.array(np.asarray(out_label)[:, columns], dtype=np.uint8)


def _cut(placement: Placement, image: Image.Image, label: Image.Image) -> tuple[Image.Image, Image.Image]:
    """Bilinear for the image, nearest for the label (no blend of two class ids is a third
    class), the same window for both; photometric jitter on the image."""
    out_image = placement.render(image, 0, Image.Resampling.BILINEAR)
    if placement.lut is not None:
        out_image = out_image.point(list(placement.lut))
    return out_image, placement.render(label, IGNORE_INDEX, Image.Resampling.NEAREST)


class SegmentationDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Manifest pairs as (uint8 image CxHxW, uint8 label HxW) tensors.

    Indexed by `SampleKey` (index, augmentation seed) when augmenting, by a plain index otherwise.
    With `verify`, every pair's bytes are checked against the manifest's sha256 as they are read
    (`checksums.py`): verdicts land in `self.checksums`, and a pair that differs is skipped (a
    blank sample, all ignore, takes its place).
    """

    def __init__(
        self,
        root: Path,
        entries: Sequence[Entry],
        augment: Augment | None = None,
        base_size: tuple[int, int] | None = None,
        decoder: ImageDecoder | None = None,
        *,
        verify: bool = False,
    ) -> None:
        self.root = root
        self.entries = list(entries)
        self.augment = augment
        self.base_size = base_size
        self.decoder = decoder or ImageDecoder("pillow")
        # Made here, before any worker starts, so that every worker writes into the same pages.
        self.checksums = ChecksumTable(len(self.entries)) if verify else None

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, key: int | SampleKey) -> tuple[torch.Tensor, torch.Tensor]:
        index, seed = key if isinstance(key, tuple) else (key, 0)
        entry = self.entries[index]
        image_bytes = read_file(self.root / entry.image)
        label_bytes = read_file(self.root / entry.label)
        if self.checksums is not None:
            # The bytes just read, hashed once: the pin is checked on what is decoded.
            found = verdict(entry, image_bytes, label_bytes)
            self.checksums.record(index, found)
            if found != CHECKED:
                return self._blank(entry, image_bytes, label_bytes, found)
        label = decode_label(label_bytes, entry.label)
        source = image_size(image_bytes)
        if source != label.size:
            raise ValueError(f"{entry.image} is {source} but {entry.label} is {label.size}")
        base = self.base_size or source
        # Not for security: a reproducible, per-sample augmentation stream.
        rng = random.Random(seed)  # noqa: S311
        placement = self.augment.plan(base, rng) if self.augment is not None else whole(base)
        # Planned in base coordinates; the files are `source` sized, and the JPEG may be decoded
        # smaller still (by 2, 4 or 8) when the crop needs fewer pixels than the file has.
        placement = _rebase(placement, source)
        needed = placement.needed()
        at_least = None if all(n >= s for n, s in zip(needed, source, strict=True)) else needed
        image = self.decoder.decode_rgb(image_bytes, at_least)
        pixels, labels = to_arrays(placement, image, label)
        return torch.from_numpy(pixels), torch.from_numpy(labels)

    def _blank(
        self, entry: Entry, image_bytes: bytes, label_bytes: bytes, found: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A pair whose bytes are not the pinned ones, skipped: a black image, every label pixel
        ignore (no loss, no gradient, no confusion count), of the size its batch needs. Neither
        file is decoded; without a crop or base size, the size comes from a header, a matching
        file's if there is one."""
        if self.augment is not None:
            width, height = self.augment.crop
        elif self.base_size is not None:
            width, height = self.base_size
        else:
            header = label_bytes if found & IMAGE_DIFFERS and not found & LABEL_DIFFERS else image_bytes
            try:
                width, height = image_size(header)
            except (OSError, ValueError) as error:
                raise ValueError(
                    f"{entry.image} / {entry.label} differ from the manifest and their size cannot be read ({error})"
                ) from error
        return (
            torch.zeros((3, height, width), dtype=torch.uint8),
            torch.full((height, width), IGNORE_INDEX, dtype=torch.uint8),
        )


def _rebase(placement: Placement, source: tuple[int, int]) -> Placement:
    """The same placement in the coordinates of an image of `source` size."""
    if placement.base == source:
        return placement
    fx, fy = source[0] / placement.base[0], source[1] / placement.base[1]
    left, top, right, bottom = placement.box
    return Placement(
        source,
        (left * fx, top * fy, right * fx, bottom * fy),
        placement.size,
        placement.out_size,
        placement.flip,
        placement.lut,
    )


def augmentation_seed(seed: int, epoch: int, index: int) -> int:
    """A seed per (run seed, epoch, sample): new augmentation every epoch, the same on resume."""
    return (seed * 1_000_003 + epoch) * 10_000_019 + index


class ResumableDistributedSampler(Sampler[SampleKey]):
    """DistributedSampler's order and padding, as (index, augmentation seed) keys, resumable at any
    sample of an epoch under any world size.

    An epoch has one global order (shuffled by seed + epoch, see `set_epoch`), which rank r reads
    from position r in strides of the world size, exactly as DistributedSampler does. So all ranks
    together always have consumed a *prefix* of that order, and where an epoch stands is one
    number, the samples consumed, that does not depend on the world size: `resume_at(position)`
    deals the rest of the order out over this job's ranks (`deal`). Under the same world size that
    is exactly what the interrupted run had left; under another, the rest of the epoch, each
    sample once. The one exception is DistributedSampler's own: when the rest does not divide by
    the world size, it is padded with the epoch's first samples (fewer than the world size), which
    are trained twice in that epoch if they land in a full step (the loader drops a last partial
    batch, so usually they do not).
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int, seed: int) -> None:
        super().__init__()
        self.length = len(dataset)
        self.num_replicas, self.rank, self.seed = num_replicas, rank, seed
        self.epoch = 0
        self.position = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume_at(self, position: int) -> None:
        """Leave out the first `position` samples of the epoch's global order (the next pass only)."""
        self.position = position

    def order(self) -> list[int]:
        """The epoch's global order: DistributedSampler's shuffle, bit for bit."""
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.length, generator=generator).tolist()

    def __iter__(self) -> Iterator[SampleKey]:
        indices = deal(self.order(), self.position, self.num_replicas, self.rank)
        self.position = 0
        return iter([(i, augmentation_seed(self.seed, self.epoch, i)) for i in indices])

    def __len__(self) -> int:
        return EpochLayout(self.length, self.num_replicas, 1).share(self.position)


def deal(order: Sequence[int], position: int, world_size: int, rank: int) -> list[int]:
    """Rank `rank`'s samples of `order` from `position` on: the rest of the order, padded to a
    multiple of the world size with the order's first samples (as DistributedSampler pads), then
    every world-size-th from `rank`. At position 0 this is DistributedSampler's shard."""
    rest = list(order[min(position, len(order)) :])
    padding = -len(rest) % world_size
    if padding:
        rest += (list(order) * math.ceil(padding / len(order)))[:padding]
    return rest[rank::world_size]


@dataclass(frozen=True)
class EpochLayout:
    """How this job cuts an epoch into optimizer steps: the sampler's arithmetic, in steps.

    A position counts samples of the epoch's global order consumed by all ranks together (what a
    checkpoint records); each rank trains its share in whole steps (the loader drops a partial
    last batch), so a resumed epoch runs from `first_step(position)` to `steps`.
    """

    samples: int  # in the training split
    world_size: int
    rank_batch: int  # samples per rank per optimizer step: batch size x gradient accumulation

    @property
    def step_samples(self) -> int:
        """Samples per optimizer step, over all ranks."""
        return self.rank_batch * self.world_size

    @property
    def steps(self) -> int:
        """Optimizer steps in a whole epoch."""
        return self.steps_left(0)

    def share(self, position: int) -> int:
        """Each rank's samples from `position` to the end of the epoch, padding included."""
        return -(-max(0, self.samples - position) // self.world_size)

    def steps_left(self, position: int) -> int:
        return self.share(position) // self.rank_batch

    def first_step(self, position: int) -> int:
        """The step of this job's epoch that `position` counts as."""
        return self.steps - self.steps_left(position)


class ShardSampler(Sampler[int]):
    """Rank r takes samples r, r + world, ...: every sample exactly once, no padding.

    DistributedSampler would pad the last shard by repeating samples, counting them twice in the
    confusion matrix; shards here may differ by one sample, so evaluation must not run collectives
    per batch (it reduces the confusion matrix once, at the end).
    """

    def __init__(self, length: int, num_replicas: int, rank: int) -> None:
        super().__init__()
        self.indices = list(range(rank, length, num_replicas))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


@functools.cache
def _normalisation(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and 1/std on the device, made once: a fresh host-to-device copy every step would
    make the host wait for the device each time."""
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    inverse_std = (1.0 / torch.tensor(STD, device=device)).view(1, 3, 1, 1)
    return mean, inverse_std


def to_device(
    images: torch.Tensor,
    labels: torch.Tensor,
    device: torch.device,
    channels_last: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 batches to normalised float images and long labels, on the device."""
    # Pinned host memory (the loader's pin_memory on GPUs) lets these copies run asynchronously.
    non_blocking = device.type == "cuda"
    mean, inverse_std = _normalisation(device)
    images = images.to(device, non_blocking=non_blocking).float().sub_(mean).mul_(inverse_std)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images, labels.to(device, non_blocking=non_blocking).long()
