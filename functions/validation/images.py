"""Images: JPEG or PNG, RGB or grayscale, within bounds, decodable to the last pixel."""

from __future__ import annotations

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


def check_image(source: Source, key: str, config: ValidationConfig = DEFAULT_CONFIG) -> FileCheck:
    """Check one image file on its own; `key` is its S3 key or path (used for the name checks
    and in messages, never opened)."""
    facts = FileFacts(key=key, role=Role.IMAGE)
    try:
        opened = open_checked(source, facts, config.image_extensions, config)
        check_image_mode(opened.image.mode)
        decode(opened.image, opened.data, opened.format)
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
