"""What counts as acceptable: one settings model shared by the intake Lambda and the CLI."""

from __future__ import annotations

import re
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from functions.common.taxonomy import DEFAULT_TAXONOMY, Taxonomy

# Pillow's own bomb guard warns above this many pixels; staying at or under it means our
# limit is always the one that speaks, with our message.
PILLOW_MAX_IMAGE_PIXELS = 89_478_485

# Extension -> the container format its content must have.
EXTENSION_FORMATS: dict[str, str] = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG"}

_S3_PREFIX = re.compile(r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?$")


def _background_is_ignored() -> dict[str, str | None]:
    # Ground Truth's unlabeled pixels carry the class name BACKGROUND.
    return {"BACKGROUND": None}


class ValidationConfig(BaseModel):
    """Bounds and vocabularies for validation; every field has a sensible default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    taxonomy: Taxonomy = DEFAULT_TAXONOMY
    image_extensions: frozenset[str] = frozenset({".jpg", ".jpeg", ".png"})
    label_extensions: frozenset[str] = frozenset({".png"})
    min_width: int = Field(default=32, ge=1)
    min_height: int = Field(default=32, ge=1)
    max_width: int = Field(default=8192, ge=1)
    max_height: int = Field(default=8192, ge=1)
    max_pixels: int = Field(default=40_000_000, ge=1, le=PILLOW_MAX_IMAGE_PIXELS)
    max_file_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    max_key_bytes: int = Field(default=1024, ge=1, le=1024)
    # Scans of one JPEG: a camera writes 1, Pillow's and libjpeg's progressive mode 10 (6 for
    # grayscale), mozjpeg a dozen or so. Each scan makes libjpeg pass over every block of the
    # image again, so a few kilobytes of scans hold a decoder for seconds per hundred.
    max_jpeg_scans: int = Field(default=100, ge=1)
    # Ground Truth class name -> taxonomy class name, or None for "ignore". A Ground Truth name
    # that is itself a taxonomy class maps to it without an entry here.
    groundtruth_class_map: dict[str, str | None] = Field(default_factory=_background_is_ignored)
    # `s3://bucket/` or `s3://bucket/prefix/`: where manifests may point. Empty: nowhere.
    allowed_sources: tuple[str, ...] = ()

    @field_validator("image_extensions", "label_extensions")
    @classmethod
    def _known_extensions(cls, extensions: frozenset[str]) -> frozenset[str]:
        lowered = frozenset(ext.lower() for ext in extensions)
        unknown = sorted(lowered - EXTENSION_FORMATS.keys())
        if unknown:
            raise ValueError(f"unsupported extensions {unknown}; known: {sorted(EXTENSION_FORMATS)}")
        return lowered

    @field_validator("label_extensions")
    @classmethod
    def _labels_are_png(cls, extensions: frozenset[str]) -> frozenset[str]:
        # JPEG's lossy compression invents class ids at every edge.
        if extensions != {".png"}:
            raise ValueError("labels must be .png: lossy formats change class ids")
        return extensions

    @field_validator("allowed_sources")
    @classmethod
    def _s3_prefixes(cls, sources: tuple[str, ...]) -> tuple[str, ...]:
        bad = [source for source in sources if not _S3_PREFIX.match(source)]
        if bad:
            raise ValueError(f"allowed sources must look like s3://bucket/prefix/: {bad}")
        return sources

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.min_width > self.max_width or self.min_height > self.max_height:
            raise ValueError("minimum image size exceeds the maximum")
        known = set(self.taxonomy.classes)
        targets = {name for name in self.groundtruth_class_map.values() if name is not None}
        unknown = sorted(targets - known)
        if unknown:
            raise ValueError(f"groundtruth_class_map targets unknown classes: {unknown}")
        return self

    def groundtruth_class_id(self, name: str) -> int | None:
        """Taxonomy id of a Ground Truth class name: the ignore value for classes mapped to
        None; None when the name is unmapped."""
        if name in self.groundtruth_class_map:
            target = self.groundtruth_class_map[name]
            if target is None:
                return self.taxonomy.ignore_index
            return self.taxonomy.classes.index(target)
        if name in self.taxonomy.classes:
            return self.taxonomy.classes.index(name)
        return None


DEFAULT_CONFIG = ValidationConfig()
