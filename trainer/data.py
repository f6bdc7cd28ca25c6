"""The data a run trains on: a frozen manifest, decoded and augmented in loader workers.

The boundary is deliberate (the loader will be optimised separately): workers read the manifest's
files with Pillow, augment (random scale, crop, flip) and hand over *uint8* tensors; the training
loop moves them to the device and normalises there (`to_device`), where it is nearly free and the
inter-process copy is four times smaller than float32.

Randomness is keyed to (seed, epoch, sample), not to worker RNG state, so a sample gets the same
augmentation whichever worker decodes it and whether or not the run was resumed half-way.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, DistributedSampler, Sampler

IGNORE_INDEX = 255
# ImageNet statistics in 0-255 units: a conventional, harmless choice for a from-scratch net.
MEAN = (123.675, 116.28, 103.53)
STD = (58.395, 57.12, 57.375)

# A sample key: (index in the split, augmentation seed).
SampleKey = tuple[int, int]


@dataclass(frozen=True)
class Entry:
    """One manifest line, as much of it as the trainer needs."""

    image: str
    label: str
    split: str
    image_sha256: str
    # Pixels per train id (keys are ids as strings, as JSON has them); empty if not recorded.
    class_pixels: dict[str, int] = field(default_factory=dict)


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
                    image_sha256=str(record.get("image_sha256", "")),
                    class_pixels={
                        str(k): int(v) for k, v in record.get("class_pixels", {}).items()
                    },
                )
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{path}:{number}: not a manifest entry ({error!r})") from error
            if entry.split not in {"train", "val"}:
                raise ValueError(
                    f"{path}:{number}: split must be train or val, not {entry.split!r}"
                )
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


@dataclass(frozen=True)
class Augment:
    """Training augmentation: random scale, random crop (padded with ignore), horizontal flip."""

    crop: tuple[int, int]  # (width, height)
    scale_min: float = 0.5
    scale_max: float = 2.0
    flip: bool = True

    def __call__(
        self, image: Image.Image, label: Image.Image, rng: random.Random
    ) -> tuple[Image.Image, Image.Image]:
        scale = rng.uniform(self.scale_min, self.scale_max)
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        image = image.resize(size, Image.Resampling.BILINEAR)
        # Nearest keeps labels labels: no blend of two class ids is a third class.
        label = label.resize(size, Image.Resampling.NEAREST)

        crop_w, crop_h = self.crop
        left = rng.randint(0, max(0, size[0] - crop_w))
        top = rng.randint(0, max(0, size[1] - crop_h))
        # Pillow pads a crop that overhangs the image: zeros for pixels, ignore for labels.
        box = (left, top, left + crop_w, top + crop_h)
        image = image.crop(box)
        label = _pad_label(label, box)
        if self.flip and rng.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            label = label.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return image, label


def _pad_label(label: Image.Image, box: tuple[int, int, int, int]) -> Image.Image:
    left, top, right, bottom = box
    out = Image.new("L", (right - left, bottom - top), IGNORE_INDEX)
    out.paste(label.crop((left, top, min(right, label.width), min(bottom, label.height))), (0, 0))
    return out


class SegmentationDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Manifest pairs as (uint8 image CxHxW, uint8 label HxW) tensors.

    Indexed by `SampleKey` (index, augmentation seed) when augmenting, by a plain index otherwise.
    """

    def __init__(
        self,
        root: Path,
        entries: Sequence[Entry],
        augment: Augment | None = None,
        base_size: tuple[int, int] | None = None,
    ) -> None:
        self.root = root
        self.entries = list(entries)
        self.augment = augment
        self.base_size = base_size

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, key: int | SampleKey) -> tuple[torch.Tensor, torch.Tensor]:
        index, seed = key if isinstance(key, tuple) else (key, 0)
        entry = self.entries[index]
        with Image.open(self.root / entry.image) as raw_image:
            image = raw_image.convert("RGB")
        with Image.open(self.root / entry.label) as raw_label:
            if raw_label.mode not in {"L", "P"}:
                raise ValueError(
                    f"{entry.label}: a label must be single-channel, not {raw_label.mode}"
                )
            label = raw_label.copy() if raw_label.mode == "L" else raw_label.convert("L")
        if image.size != label.size:
            raise ValueError(f"{entry.image} is {image.size} but {entry.label} is {label.size}")
        if self.base_size is not None and image.size != self.base_size:
            image = image.resize(self.base_size, Image.Resampling.BILINEAR)
            label = label.resize(self.base_size, Image.Resampling.NEAREST)
        if self.augment is not None:
            # Not for security: a reproducible, per-sample augmentation stream.
            image, label = self.augment(image, label, random.Random(seed))  # noqa: S311
        pixels = torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1).contiguous()
        return pixels, torch.from_numpy(np.array(label, dtype=np.uint8))


def augmentation_seed(seed: int, epoch: int, index: int) -> int:
    """A seed per (run seed, epoch, sample): new augmentation every epoch, the same on resume."""
    return (seed * 1_000_003 + epoch) * 10_000_019 + index


class ResumableDistributedSampler(Sampler[SampleKey]):
    """DistributedSampler's order, as (index, augmentation seed) keys, able to skip what was done.

    Order and padding are exactly DistributedSampler's (shuffled by seed + epoch, see
    `set_epoch`), so a run resumed at `skip(n)` gets the very samples the interrupted one had left.
    """

    def __init__(
        self, dataset: SegmentationDataset, num_replicas: int, rank: int, seed: int
    ) -> None:
        super().__init__()
        self.sampler: DistributedSampler[int] = DistributedSampler(
            dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed
        )
        self.seed = seed
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.sampler.set_epoch(epoch)

    def skip(self, samples: int) -> None:
        """Leave out the first `samples` of this rank's next pass (that pass only)."""
        self.start = samples

    def __iter__(self) -> Iterator[SampleKey]:
        indices = list(self.sampler)[self.start :]
        self.start = 0
        return iter([(i, augmentation_seed(self.seed, self.epoch, i)) for i in indices])

    def __len__(self) -> int:
        return len(self.sampler) - self.start


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


def to_device(
    images: torch.Tensor,
    labels: torch.Tensor,
    device: torch.device,
    channels_last: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 batches to normalised float images and long labels, on the device."""
    non_blocking = device.type == "cuda"
    images = images.to(device, non_blocking=non_blocking).float()
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)
    images = (images - mean) / std
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images, labels.to(device, non_blocking=non_blocking).long()
