"""What every file goes through, image or label: name, bytes, magic, header, size, frames."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from PIL import Image

from functions.validation.config import EXTENSION_FORMATS, ValidationConfig
from functions.validation.decoding import (
    Source,
    check_content_format,
    check_declared_size,
    check_frames,
    check_jpeg_scans,
    open_header,
    png_header,
    read_source,
)
from functions.validation.names import check_extension, check_key_safety
from functions.validation.reasons import RejectedError
from functions.validation.results import FileCheck, Reason, Role


@dataclass
class FileFacts:
    """What has been learnt about a file so far; a rejection keeps what was learnt before it
    (a truncated image still has a known size and hash)."""

    key: str
    role: Role
    size_bytes: int = 0
    sha256: str | None = None
    format: str | None = None
    mode: str | None = None
    width: int | None = None
    height: int | None = None
    value_pixels: dict[int, int] | None = None

    def to_check(self, error: RejectedError | None = None) -> FileCheck:
        reasons = () if error is None else (Reason.from_error(error, self.key),)
        return FileCheck(
            key=self.key,
            role=self.role,
            size_bytes=self.size_bytes,
            sha256=self.sha256,
            format=self.format,
            mode=self.mode,
            width=self.width,
            height=self.height,
            value_pixels=self.value_pixels,
            reasons=reasons,
        )


@dataclass(frozen=True)
class Opened:
    data: bytes
    image: Image.Image  # header parsed, pixels not decoded yet
    format: str  # the container format: "JPEG" or "PNG"


def open_checked(source: Source, facts: FileFacts, extensions: frozenset[str], config: ValidationConfig) -> Opened:
    """Run the checks every file shares and open its header; raise `RejectedError` at the
    first defect, before any pixel is decoded."""
    check_key_safety(facts.key, config.max_key_bytes)
    extension = check_extension(facts.key, extensions)
    expected = EXTENSION_FORMATS[extension]
    data = read_source(source, config.max_file_bytes)
    facts.size_bytes = len(data)
    facts.sha256 = hashlib.sha256(data).hexdigest()
    check_content_format(data, expected, extension)
    if expected == "PNG":
        # Our own bound first, from the raw IHDR, so Pillow never sees an absurd size.
        header = png_header(data)
        facts.width, facts.height = header.width, header.height
        check_declared_size(header.width, header.height, config)
    else:
        check_jpeg_scans(data, config.max_jpeg_scans)
    image = open_header(data, expected)
    facts.format, facts.mode = image.format, image.mode
    facts.width, facts.height = image.size
    check_declared_size(image.width, image.height, config)
    check_frames(image)
    return Opened(data=data, image=image, format=expected)
