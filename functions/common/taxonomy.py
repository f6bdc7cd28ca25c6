"""The class taxonomy: which mask values mean what.

The default is the 19 Cityscapes training classes (train ids 0-18) with 255 as the ignore value,
as in the official `cityscapesscripts` label table. A deployment may configure its own list; the
position of a name in the list is its class id.
"""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, ConfigDict, Field, field_validator

IGNORE_INDEX = 255

CITYSCAPES_CLASSES: tuple[str, ...] = (
    "road",
    "sidewalk",
    "building",
    "wall",
    "fence",
    "pole",
    "traffic light",
    "traffic sign",
    "vegetation",
    "terrain",
    "sky",
    "person",
    "rider",
    "car",
    "truck",
    "bus",
    "train",
    "motorcycle",
    "bicycle",
)

# The official Cityscapes colors of the train ids, used to render masks for people to look at.
CITYSCAPES_COLORS: tuple[tuple[int, int, int], ...] = (
    (128, 64, 128),
    (244, 35, 232),
    (70, 70, 70),
    (102, 102, 156),
    (190, 153, 153),
    (153, 153, 153),
    (250, 170, 30),
    (220, 220, 0),
    (107, 142, 35),
    (152, 251, 152),
    (70, 130, 180),
    (220, 20, 60),
    (255, 0, 0),
    (0, 0, 142),
    (0, 0, 70),
    (0, 60, 100),
    (0, 80, 100),
    (0, 0, 230),
    (119, 11, 32),
)


class Taxonomy(BaseModel):
    """Class names in id order: mask value `i` is `classes[i]`; `ignore_index` is unlabeled."""

    model_config = ConfigDict(frozen=True)

    classes: tuple[str, ...] = Field(default=CITYSCAPES_CLASSES, min_length=1, max_length=255)
    ignore_index: int = Field(default=IGNORE_INDEX, ge=0, le=255)

    @field_validator("classes")
    @classmethod
    def _names_are_unique(cls, classes: tuple[str, ...]) -> tuple[str, ...]:
        repeated = sorted(name for name, count in Counter(classes).items() if count > 1)
        if repeated:
            raise ValueError(f"class names must be unique; repeated: {', '.join(repeated)}")
        return classes

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def is_valid_value(self, value: int) -> bool:
        return value == self.ignore_index or 0 <= value < self.num_classes


DEFAULT_TAXONOMY = Taxonomy()
