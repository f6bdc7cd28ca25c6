"""Images: JPEG or PNG, RGB or grayscale, within bounds, decodable to the last pixel, upright."""

from __future__ import annotations

from PIL import ExifTags, Image

from functions.validation.config import DEFAULT_CONFIG, ValidationConfig
from functions.validation.decoding import Source, decode
from functions.validation.files import FileFacts, open_checked
from functions.validation.reasons import ReasonCode, RejectedError
from functions.validation.results import FileCheck, Role

IMAGE_MODES = ("RGB", "L")

_MODE_HINTS = {
    "RGBA": "RGB with an alpha channel",
    "LA": "grayscale with an alpha channel",
    "P": "a palette image",
    "CMYK": "CMYK (print colors)",
    "1": "1-bit black and white",
    "I;16": "16-bit grayscale",
    "I;16B": "16-bit grayscale",
    "I": "32-bit integer",
    "F": "32-bit float",
}

# EXIF orientations other than 1 (as stored): how a viewer turns the stored pixels to show them.
_ORIENTATIONS = {
    2: "mirrored left to right",
    3: "turned 180 degrees",
    4: "mirrored top to bottom",
    5: "mirrored across its main diagonal (transposed)",
    6: "turned 90 degrees clockwise",
    7: "mirrored across its other diagonal (transversed)",
    8: "turned 90 degrees counter-clockwise",
}


def check_image(source: Source, key: str, config: ValidationConfig = DEFAULT_CONFIG) -> FileCheck:
    """Check one image file on its own; `key` is its S3 key or path (used for the name checks
    and in messages, never opened)."""
    facts = FileFacts(key=key, role=Role.IMAGE)
    try:
        opened = open_checked(source, facts, config.image_extensions, config)
        check_image_mode(opened.image.mode)
        decode(opened.image, opened.data, opened.format)
        check_orientation(opened.image)
    except RejectedError as error:
        return facts.to_check(error)
    return facts.to_check()


def check_image_mode(mode: str) -> None:
    if mode not in IMAGE_MODES:
        described = _MODE_HINTS.get(mode, "not RGB or grayscale")
        raise RejectedError(
            ReasonCode.IMAGE_MODE_UNSUPPORTED,
            f"mode {mode} ({described}); images must be RGB or L (8-bit grayscale)",
        )


def check_orientation(image: Image.Image) -> None:
    """Reject an image whose EXIF (or XMP) orientation is not the identity.

    Viewers and annotation tools show such a photo rotated or mirrored, and masks are drawn on
    what they show; the trainer decodes the stored pixels and never applies the orientation
    (`trainer/decode.py`). Accepting the mask in the displayed orientation instead would need
    every decoder to apply it, and cannot be checked: a 180-degree turn or a mirror keeps the
    size, so nothing tells which orientation a mask was drawn in. Rejecting is unambiguous, and
    the fix (re-export with the rotation applied) keeps a mask drawn on the displayed photo.
    Read after decoding: a PNG's eXIf chunk may follow its pixel data.
    """
    try:
        orientation = image.getexif().get(ExifTags.Base.Orientation)
    except Exception:  # unreadable EXIF: viewers cannot apply it either, so none is shown
        return
    if isinstance(orientation, int) and orientation in _ORIENTATIONS:
        raise RejectedError(
            ReasonCode.IMAGE_EXIF_ROTATED,
            f"EXIF orientation {orientation}: viewers and annotation tools show the photo "
            f"{_ORIENTATIONS[orientation]}, but training reads its stored pixels unrotated, so a "
            "mask drawn on the displayed photo would not line up; re-export the photo with its "
            "rotation applied (orientation 1) and check the mask against it",
        )
