"""The stable reason codes: why a file or a pair was not accepted.

Codes are part of the data contract: they land in the ledger, in `quarantine/.../*.reason.json`
and in batch reports, and annotators grep for them. Add codes freely; never rename one.
"""

from __future__ import annotations

from enum import StrEnum

from functions.common.errors import RetrainError


class ReasonCode(StrEnum):
    # Names and layout.
    UNSAFE_NAME = "unsafe_name"
    UNSUPPORTED_EXTENSION = "unsupported_extension"
    UNEXPECTED_FILE = "unexpected_file"
    AMBIGUOUS_STEM = "ambiguous_stem"
    MISSING_IMAGE = "missing_image"
    MISSING_LABEL = "missing_label"
    # Bytes and container format.
    EMPTY_FILE = "empty_file"
    FILE_TOO_LARGE = "file_too_large"
    ENCRYPTION_NOT_ACCEPTED = "encryption_not_accepted"
    NOT_AN_IMAGE = "not_an_image"
    UNSUPPORTED_FORMAT = "unsupported_format"
    EXTENSION_MISMATCH = "extension_mismatch"
    # What the header declares, checked before any pixel is decoded.
    DECOMPRESSION_BOMB = "decompression_bomb"
    IMAGE_TOO_LARGE = "image_too_large"
    IMAGE_TOO_SMALL = "image_too_small"
    IMAGE_MODE_UNSUPPORTED = "image_mode_unsupported"
    IMAGE_ANIMATED = "image_animated"
    JPEG_TOO_MANY_SCANS = "jpeg_too_many_scans"
    # Decoding.
    IMAGE_TRUNCATED = "image_truncated"
    IMAGE_UNDECODABLE = "image_undecodable"
    IMAGE_ROWS_MISSING = "image_rows_missing"
    IMAGE_EXIF_ROTATED = "image_exif_rotated"
    DECODE_TOO_SLOW = "decode_too_slow"
    # Masks.
    MASK_NOT_SINGLE_CHANNEL = "mask_not_single_channel"
    MASK_NOT_8BIT = "mask_not_8bit"
    MASK_SIZE_MISMATCH = "mask_size_mismatch"
    MASK_UNKNOWN_CLASS = "mask_unknown_class"
    MASK_UNKNOWN_COLOR = "mask_unknown_color"
    MASK_ALL_IGNORE = "mask_all_ignore"
    # Duplicates.
    DUPLICATE_IMAGE = "duplicate_image"
    # SageMaker Ground Truth manifests.
    MANIFEST_ENTRY_INVALID = "manifest_entry_invalid"
    SOURCE_NOT_ALLOWED = "source_not_allowed"
    CLASS_NOT_MAPPED = "class_not_mapped"


DESCRIPTIONS: dict[ReasonCode, str] = {
    ReasonCode.UNSAFE_NAME: (
        "the name is unsafe as a path or S3 key (.., absolute, control or invisible characters, "
        "backslash, not UTF-8, key over 1024 bytes)"
    ),
    ReasonCode.UNSUPPORTED_EXTENSION: ("the extension is not accepted (images: .jpg .jpeg .png; labels: .png)"),
    ReasonCode.UNEXPECTED_FILE: "the file is outside images/ and labels/",
    ReasonCode.AMBIGUOUS_STEM: "two images or two labels share one stem",
    ReasonCode.MISSING_IMAGE: "a label has no image with its stem (yet)",
    ReasonCode.MISSING_LABEL: "an image has no label with its stem (yet)",
    ReasonCode.EMPTY_FILE: "the file has zero bytes",
    ReasonCode.FILE_TOO_LARGE: "the file has more bytes than the configured limit",
    ReasonCode.ENCRYPTION_NOT_ACCEPTED: (
        "the object is encrypted otherwise than with the stack's KMS key (SSE-C, SSE-S3 or another KMS "
        "key): it cannot or may not be read"
    ),
    ReasonCode.NOT_AN_IMAGE: "the content is not an image at all",
    ReasonCode.UNSUPPORTED_FORMAT: "the content is an image format other than JPEG or PNG",
    ReasonCode.EXTENSION_MISMATCH: "the extension says one format, the content is another",
    ReasonCode.DECOMPRESSION_BOMB: (
        "the header declares more pixels than the limit, or compressed metadata expands "
        "beyond Pillow's limits (rejected before decoding)"
    ),
    ReasonCode.IMAGE_TOO_LARGE: "width or height above the configured bounds",
    ReasonCode.IMAGE_TOO_SMALL: "width or height below the configured bounds",
    ReasonCode.IMAGE_MODE_UNSUPPORTED: ("the image is not RGB or grayscale (e.g. CMYK, RGBA, 16-bit)"),
    ReasonCode.IMAGE_ANIMATED: "the file holds several frames (animated PNG, multi-picture)",
    ReasonCode.JPEG_TOO_MANY_SCANS: (
        "a progressive JPEG with more scans than the limit (cameras write 1, encoders about 10): each "
        "scan makes the decoder pass over the whole image again (rejected before decoding)"
    ),
    ReasonCode.IMAGE_TRUNCATED: "the file ends before its pixel data does",
    ReasonCode.IMAGE_UNDECODABLE: "the file is corrupt: the decoder failed",
    ReasonCode.IMAGE_ROWS_MISSING: (
        "a PNG's compressed pixel data ends cleanly before its last row (image or mask): the "
        "missing rows would read as 0"
    ),
    ReasonCode.IMAGE_EXIF_ROTATED: (
        "the image's EXIF orientation rotates or mirrors it for display, but training reads the stored pixels"
    ),
    ReasonCode.DECODE_TOO_SLOW: (
        "checking the file took longer than the intake's decode time limit: it was stopped (a file "
        "built to be slow to decode, or one too large for the function's memory and CPU)"
    ),
    ReasonCode.MASK_NOT_SINGLE_CHANNEL: "the mask has color or alpha channels instead of class ids",
    ReasonCode.MASK_NOT_8BIT: "the mask is not 8 bits per pixel (1-, 2-, 4- or 16-bit gray)",
    ReasonCode.MASK_SIZE_MISMATCH: "the mask's width and height differ from its image's",
    ReasonCode.MASK_UNKNOWN_CLASS: ("the mask holds values that are no class id nor the ignore value"),
    ReasonCode.MASK_UNKNOWN_COLOR: "a Ground Truth mask holds colors missing from its color map",
    ReasonCode.MASK_ALL_IGNORE: "every pixel of the mask is the ignore value",
    ReasonCode.DUPLICATE_IMAGE: "the image's bytes are identical to an earlier image's",
    ReasonCode.MANIFEST_ENTRY_INVALID: "a manifest line is not a semantic-segmentation entry",
    ReasonCode.SOURCE_NOT_ALLOWED: "a manifest points outside the allowed S3 locations",
    ReasonCode.CLASS_NOT_MAPPED: "a Ground Truth class name maps to no taxonomy class",
}


class RejectedError(RetrainError):
    """A check found a defect; carries the reason out of nested checks to the one place that
    records it, so each check stays a short function that either returns or raises."""

    def __init__(self, code: ReasonCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
