"""The Pillow boundary: bytes in, a decoded image or a `RejectedError` out.

Every defence against hostile files sits here, in the order that keeps memory bounded: the
byte count, the magic bytes, the declared size and mode (Pillow's `Image.open` reads only the
header), and only then the pixels. Any exception Pillow raises on weird bytes becomes a reason
code, never a traceback.
"""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from typing import NamedTuple, Protocol

from PIL import Image, ImageFile, UnidentifiedImageError

from functions.common.errors import RetrainError
from functions.validation.config import ValidationConfig
from functions.validation.reasons import ReasonCode, RejectedError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_IEND = b"\x00\x00\x00\x00IEND\xae\x42\x60\x82"
_PNG_HEADER_END = 33  # signature, IHDR length and type, 13 bytes of IHDR data, CRC

# Pillow names a JPEG with a multi-picture index (some cameras write one) MPO.
_PILLOW_NAMES = {"JPEG": ("JPEG", "MPO"), "PNG": ("PNG",)}

# Formats named by their magic bytes, so the message says what the file really is.
_MAGIC: tuple[tuple[int, bytes, str], ...] = (
    (0, PNG_SIGNATURE, "PNG"),
    (0, b"\xff\xd8\xff", "JPEG"),
    (0, b"GIF87a", "GIF"),
    (0, b"GIF89a", "GIF"),
    (0, b"BM", "BMP"),
    (0, b"II*\x00", "TIFF"),
    (0, b"MM\x00*", "TIFF"),
    (8, b"WEBP", "WEBP"),
    (4, b"ftypheic", "HEIC"),
    (4, b"ftypmif1", "HEIF"),
    (4, b"ftypavif", "AVIF"),
    (0, b"\x00\x00\x00\x0cjP  ", "JPEG 2000"),
    (0, b"\xff\x4f\xff\x51", "JPEG 2000"),
    (0, b"8BPS", "PSD"),
    (0, b"qoif", "QOI"),
    (0, b"\x00\x00\x01\x00", "ICO"),
    (0, b"%PDF", "PDF"),
)


class Readable(Protocol):
    """A binary file object or a botocore StreamingBody."""

    def read(self, size: int, /) -> bytes: ...


Source = bytes | Readable


class StrictDecodingDisabledError(RetrainError, RuntimeError):
    """Someone set `ImageFile.LOAD_TRUNCATED_IMAGES`; truncated files would then pass."""


class PngHeader(NamedTuple):
    width: int
    height: int
    bit_depth: int
    color_type: int  # 0 gray, 2 RGB, 3 palette, 4 gray+alpha, 6 RGBA


def read_source(source: Source, limit: int) -> bytes:
    """All of `source`'s bytes; never more than `limit` + 1 of them in memory."""
    data = source if isinstance(source, bytes) else _read_at_most(source, limit + 1)
    if not data:
        raise RejectedError(ReasonCode.EMPTY_FILE, "the file is empty (0 bytes)")
    if len(data) > limit:
        # Readers stop one byte past the limit, so the true size is unknown here.
        raise RejectedError(ReasonCode.FILE_TOO_LARGE, f"the file is larger than the limit of {limit} bytes")
    return data


def _read_at_most(stream: Readable, size: int) -> bytes:
    # A network stream may return fewer bytes than asked for before its end.
    chunks: list[bytes] = []
    while size > 0 and (chunk := stream.read(size)):
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def sniff_format(data: bytes) -> str | None:
    for offset, magic, name in _MAGIC:
        if data.startswith(magic, offset):
            return name
    return None


def check_content_format(data: bytes, expected: str, extension: str) -> None:
    """Raise unless the content is the `expected` format that `extension` promises."""
    found = sniff_format(data)
    if found is None:
        raise RejectedError(
            ReasonCode.NOT_AN_IMAGE,
            f"the content is not an image (it starts with {data[:8].hex(' ')})",
        )
    if found not in _PILLOW_NAMES:
        raise RejectedError(ReasonCode.UNSUPPORTED_FORMAT, f"the content is {found}; only JPEG and PNG are accepted")
    if found != expected:
        raise RejectedError(
            ReasonCode.EXTENSION_MISMATCH,
            f"the name ends in {extension} but the content is {found}",
        )


def png_header(data: bytes) -> PngHeader:
    """The IHDR fields, read straight from the bytes (Pillow widens 2- and 4-bit gray to 8-bit
    and hides the original depth, which changes what a mask's values mean)."""
    if len(data) < _PNG_HEADER_END:
        raise RejectedError(ReasonCode.IMAGE_TRUNCATED, f"the PNG ends inside its header ({len(data)} bytes)")
    if data[12:16] != b"IHDR":
        raise RejectedError(ReasonCode.IMAGE_UNDECODABLE, "the PNG does not start with IHDR")
    # A corrupt header must be called corrupt, not judged by the absurd size it now declares.
    (stored_crc,) = struct.unpack(">I", data[29:33])
    if zlib.crc32(data[12:29]) != stored_crc:
        raise RejectedError(ReasonCode.IMAGE_UNDECODABLE, "the PNG header (IHDR) fails its checksum: corrupt")
    return PngHeader(*struct.unpack(">IIBB", data[16:26]))


def check_declared_size(width: int, height: int, config: ValidationConfig) -> None:
    """Bounds on what the header declares, so no absurd size is ever allocated."""
    if width * height > config.max_pixels:
        raise RejectedError(
            ReasonCode.DECOMPRESSION_BOMB,
            f"the header declares {width}x{height} = {width * height} pixels, more than the "
            f"limit of {config.max_pixels}; not decoded",
        )
    if width > config.max_width or height > config.max_height:
        raise RejectedError(
            ReasonCode.IMAGE_TOO_LARGE,
            f"{width}x{height} exceeds the maximum of {config.max_width}x{config.max_height}",
        )
    if width < config.min_width or height < config.min_height:
        raise RejectedError(
            ReasonCode.IMAGE_TOO_SMALL,
            f"{width}x{height} is below the minimum of {config.min_width}x{config.min_height}",
        )


def open_header(data: bytes, expected: str) -> Image.Image:
    """Pillow's lazy open: parses the header, decodes no pixel."""
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise StrictDecodingDisabledError(
            "PIL.ImageFile.LOAD_TRUNCATED_IMAGES is True in this process: truncated files would pass validation"
        )
    with warnings.catch_warnings():
        # Pillow only warns between its two thresholds; for us that is a rejection too.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data), formats=_PILLOW_NAMES[expected])
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise RejectedError(ReasonCode.DECOMPRESSION_BOMB, f"{exc}; not decoded") from exc
        except Exception as exc:  # Pillow raises many types on hostile bytes: see _failure
            raise _failure(expected, exc) from exc
    return image


def check_frames(image: Image.Image) -> None:
    frames: int = getattr(image, "n_frames", 1)
    if frames > 1:
        raise RejectedError(
            ReasonCode.IMAGE_ANIMATED,
            f"the {image.format} file holds {frames} frames; one still image is expected",
        )


def decode(image: Image.Image, data: bytes, expected: str) -> None:
    """Decode every pixel: this is what finds truncated and corrupt files."""
    try:
        image.load()
    except Exception as exc:  # any decoder failure is a defect of the file, not of ours
        raise _failure(expected, exc) from exc
    # Pillow stops at the end of the pixel data and forgives a missing IEND chunk, so a PNG
    # cut off right after its pixels would otherwise pass.
    if expected == "PNG" and data.rfind(_PNG_IEND) == -1:
        raise RejectedError(ReasonCode.IMAGE_TRUNCATED, "the PNG ends without its IEND chunk")


def _failure(expected: str, exc: Exception) -> RejectedError:
    if isinstance(exc, ValueError) and "Decompressed data too large" in str(exc):
        return RejectedError(
            ReasonCode.DECOMPRESSION_BOMB,
            f"compressed PNG metadata expands beyond Pillow's limit ({exc})",
        )
    if isinstance(exc, EOFError) or "truncated" in str(exc).lower():
        return RejectedError(ReasonCode.IMAGE_TRUNCATED, f"the {expected} file ends before its image data does")
    if isinstance(exc, UnidentifiedImageError):
        # Its message names a memory address; say what it means instead.
        return RejectedError(ReasonCode.IMAGE_UNDECODABLE, f"the {expected} header is corrupt or unreadable")
    return RejectedError(
        ReasonCode.IMAGE_UNDECODABLE,
        f"the {expected} decoder failed: {type(exc).__name__}: {str(exc)[:200]}",
    )
