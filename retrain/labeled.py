"""A frozen manifest for a plain labeled folder, built as the intake and the trigger would.

A labeled folder is one batch in the layout `retrain validate` checks: `DIR/images/<stem>.jpg|png`
and `DIR/labels/<stem>.png`. Every item goes through the intake's validation (`plan_pairs`,
`validate_planned`, duplicates by content hash); what the intake would curate becomes a manifest
entry exactly as the trigger writes it when it freezes a dataset version (`Trigger._entry`):
paths relative to DIR, both sha256s, pixels per class id, the split from the image's content
hash (`split_for`), the batch name. What the intake would quarantine (invalid, incomplete,
duplicate) is left out and returned, so the caller can say why.

Differences from a frozen S3 version, both forced by a local folder: there are no S3 VersionIds
(the sha256s pin the bytes instead), and the batch is the folder's name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from functions.common.contracts import ManifestEntry, split_for
from functions.common.prefixes import IMAGES_DIR, LABELS_DIR
from functions.validation import (
    DEFAULT_CONFIG,
    InMemoryContentIndex,
    LocalBatchReader,
    PairResult,
    PlannedItem,
    Status,
    ValidationConfig,
    plan_pairs,
    validate_planned,
)

# The trigger's default (TriggerPolicy.val_fraction, TriggerSettings.val_fraction).
DEFAULT_VAL_FRACTION = 0.1
_UNSAFE = re.compile(r"[^A-Za-z0-9-]+")


@dataclass(frozen=True)
class FolderDataset:
    """What a labeled folder yields: the manifest's entries and the items left out."""

    version: str
    entries: list[ManifestEntry]
    left_out: list[PairResult]

    @property
    def train(self) -> int:
        return sum(entry.split == "train" for entry in self.entries)

    @property
    def val(self) -> int:
        return sum(entry.split == "val" for entry in self.entries)


def is_labeled_folder(folder: Path) -> bool:
    """Whether `folder` has the images/ + labels/ layout of one batch."""
    return (folder / IMAGES_DIR).is_dir() and (folder / LABELS_DIR).is_dir()


def plan(folder: Path, config: ValidationConfig = DEFAULT_CONFIG, *, exclude: Path | None = None) -> list[PlannedItem]:
    """The folder's items, as `retrain validate` and the sweeper group them (by stem); files
    under `exclude` (a run's output kept inside the folder) are not items."""
    keys = LocalBatchReader(folder).keys()
    if exclude is not None and exclude.resolve().is_relative_to(folder.resolve()):
        skipped = exclude.resolve().relative_to(folder.resolve()).as_posix()
        if skipped != ".":
            keys = [key for key in keys if key != skipped and not key.startswith(f"{skipped}/")]
    return plan_pairs(keys, config)


def build_manifest(
    folder: Path,
    *,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    config: ValidationConfig = DEFAULT_CONFIG,
    planned: list[PlannedItem] | None = None,
    advance: Callable[[], None] | None = None,
) -> FolderDataset:
    """Validate every item of `folder` and make the manifest of the valid pairs.

    `planned` is `plan(folder, config)` when the caller needed its length already (a progress
    bar); `advance` is called once per item validated. Reads the folder, writes nothing.
    """
    if not 0.0 <= val_fraction <= 1.0:
        raise ValueError(f"val_fraction must be within [0, 1], got {val_fraction}")
    reader = LocalBatchReader(folder)
    items = plan(folder, config) if planned is None else planned
    # One index per folder, as one batch: a second copy of an image is a duplicate.
    index = InMemoryContentIndex()
    ids = {name: str(number) for number, name in enumerate(config.taxonomy.classes)}
    batch = folder.resolve().name or "local"
    entries: list[ManifestEntry] = []
    left_out: list[PairResult] = []
    for item in items:
        result = validate_planned(item, reader, config=config, index=index)
        if advance is not None:
            advance()
        if result.status is not Status.VALID:
            left_out.append(result)
            continue
        assert result.image and result.label and result.image_sha256 and result.label_sha256
        entries.append(
            ManifestEntry(
                image=result.image,
                label=result.label,
                image_sha256=result.image_sha256,
                label_sha256=result.label_sha256,
                split=split_for(result.image_sha256, val_fraction),
                class_pixels={ids[name]: count for name, count in (result.class_pixels or {}).items() if name in ids},
                batch=batch,
            )
        )
    return FolderDataset(version=version_name(batch, entries), entries=entries, left_out=left_out)


def version_name(batch: str, entries: list[ManifestEntry]) -> str:
    """`<folder>-<content hash>`: the same pairs give the same version (so `--resume` can check
    that it continues on the same data), other pairs or splits another."""
    digest = hashlib.sha256()
    for entry in entries:
        digest.update(f"{entry.image}:{entry.image_sha256}:{entry.label}:{entry.label_sha256}:{entry.split}\n".encode())
    slug = _UNSAFE.sub("-", batch).strip("-")[:40] or "local"
    return f"{slug}-{digest.hexdigest()[:8]}"
