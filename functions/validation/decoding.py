"""The Pillow boundary: bytes in, a decoded image or a `RejectedError` out.

Every defence against hostile files sits here, in the order that keeps memory bounded: the
byte count, the magic bytes, the declared size and mode (Pillow's `Image.open` reads only the
header), and only then the pixels. Any exception Pillow raises on weird bytes becomes a reason
code, never a traceback.
"""

from __future__ import annotations

import io
import re
import struct
import warnings
import zlib
from collections.abc import Iterator
from typing import NamedTuple, Protocol

from PIL import Image, ImageFile, UnidentifiedImageError

from functions.common.errors import RetrainError
from functions.validation.config import ValidationConfig
from functions.validation.reasons import ReasonCode, RejectedError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_IEND = b"\x00\x00\x00\x00IEND\xae\x42\x60\x82"
_PNG_HEADER_END = 33  # signature, IHDR length and type, 13 bytes of IHDR data, CRC
_PNG_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # samples per pixel, by color type
# Adam7's passes: first column, first row, column step, row step.
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
# What a PNG's pixels hold before the decoder writes them, per band. 254 is no class id, so a
# valid mask's last row never looks unwritten (see `check_rows_complete`).
_UNWRITTEN = (254, 1, 253, 2)
_INFLATE_STEP = 1 << 20

# JPEG markers that stand alone, without a length: TEM and the restart markers RST0-7 (SOI and
# EOI are handled apart).
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})
_JPEG_SOS, _JPEG_EOI = 0xDA, 0xD9
# The next marker in a scan's entropy-coded data: 0xFF followed by neither a stuffed 0x00, a fill
# 0xFF nor a restart marker. One byte each side, never `\xff+`: a long run of 0xFF would make the
# search quadratic.
_JPEG_NEXT_MARKER = re.compile(rb"\xff[^\x00\xff\xd0-\xd7]")

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
    interlaced: bool = False  # Adam7


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


def jpeg_scans(data: bytes, stop_after: int) -> int:
    """How many scans (SOS markers) the JPEG's first image has, counted up to `stop_after` + 1.

    Walked segment by segment, by their lengths, so that an SOS inside another segment (an EXIF
    thumbnail is a whole JPEG) is not counted; after each scan header, its entropy-coded data is
    skipped with one search for the next marker. Linear in the file's size, whatever its bytes:
    a corrupt file just stops the count, and Pillow says what is wrong with it.
    """
    scans, at = 0, 2  # after SOI
    while at + 1 < len(data) and data[at] == 0xFF:
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte before a marker
            at += 1
            continue
        if marker == _JPEG_EOI:
            break
        if marker in _JPEG_STANDALONE:
            at += 2
            continue
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
        if marker == _JPEG_SOS:
            scans += 1
            if scans > stop_after:
                break
            found = _JPEG_NEXT_MARKER.search(data, at)
            if found is None:
                break
            at = found.start()
    return scans


def check_jpeg_scans(data: bytes, limit: int) -> None:
    """Refuse a JPEG with more than `limit` scans before any pixel is decoded: libjpeg decodes
    every scan over the whole image, so a small file of many scans holds it for minutes."""
    scans = jpeg_scans(data, limit)
    if scans > limit:
        raise RejectedError(
            ReasonCode.JPEG_TOO_MANY_SCANS,
            f"the progressive JPEG has more than {limit} scans (cameras write 1, encoders about 10); "
            "not decoded: re-export it as a baseline JPEG",
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
    width, height, bit_depth, color_type = struct.unpack(">IIBB", data[16:26])
    return PngHeader(width, height, bit_depth, color_type, interlaced=data[28] == 1)


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
    fill = _prefill(image) if expected == "PNG" else None
    try:
        image.load()
    except Exception as exc:  # any decoder failure is a defect of the file, not of ours
        raise _failure(expected, exc) from exc
    # Pillow stops at the end of the pixel data and forgives a missing IEND chunk, so a PNG
    # cut off right after its pixels would otherwise pass.
    if expected == "PNG" and data.rfind(_PNG_IEND) == -1:
        raise RejectedError(ReasonCode.IMAGE_TRUNCATED, "the PNG ends without its IEND chunk")
    if fill is not None:
        check_rows_complete(image, data, fill)


def _prefill(image: Image.Image) -> int | tuple[int, ...] | None:
    """Give a PNG not yet decoded its pixel memory, filled with `_UNWRITTEN` instead of zeros,
    so that pixels the decoder never writes can be told from black ones; the fill, or None if
    the image is already decoded."""
    if not isinstance(image, ImageFile.ImageFile) or not image.tile:
        return None
    bands = len(image.getbands())
    fill = _UNWRITTEN[0] if bands == 1 else _UNWRITTEN[:bands]
    # Pillow's `load_prepare` allocates pixel memory only when the image has none.
    image.im = Image.new(image.mode, image.size, fill).im
    return fill


def check_rows_complete(image: Image.Image, data: bytes, fill: int | tuple[int, ...]) -> None:
    """Raise if a decoded PNG's compressed data closed before its last row.

    Pillow stops without an error when the zlib stream ends cleanly, and leaves the rows it
    never got as they were. The decoder writes rows in file order (for Adam7, the last pass
    covers every odd row), so the row written last tells: if any of its pixels differs from the
    fill, every row came. Only when it is all fill, a real row of that color or a missing one,
    are the pixel data inflated a second time to count their bytes.
    """
    header = png_header(data)
    last = header.height - 1
    if header.interlaced:
        last -= 1 - last % 2  # the last odd row; none at height 1, where the count decides
    if last >= 0:
        row = image.crop((0, last, image.width, last + 1)).tobytes()
        if row != Image.new(image.mode, (image.width, 1), fill).tobytes():
            return
    expected = _pixel_data_size(header)
    found = _inflated_size(data, expected)
    if found >= expected:
        return
    if header.interlaced:
        raise RejectedError(
            ReasonCode.IMAGE_ROWS_MISSING,
            f"the interlaced PNG's compressed pixel data ends early: it holds {found} of the "
            f"{expected} bytes its {header.width}x{header.height} header needs; a decoder "
            "fills the rest with 0",
        )
    present = found // (1 + _row_bytes(header.width, header))
    raise RejectedError(
        ReasonCode.IMAGE_ROWS_MISSING,
        f"the PNG's compressed pixel data ends after {present} of its {header.height} rows; a "
        f"decoder fills the other {header.height - present} with 0",
    )


def _row_bytes(width: int, header: PngHeader) -> int:
    return (width * header.bit_depth * _PNG_SAMPLES.get(header.color_type, 1) + 7) // 8


def _pixel_data_size(header: PngHeader) -> int:
    """Bytes of the inflated pixel data: each row is a filter byte and its samples."""
    if not header.interlaced:
        return header.height * (1 + _row_bytes(header.width, header))
    total = 0
    for column, row, column_step, row_step in _ADAM7:
        width = max(0, -(-(header.width - column) // column_step))
        height = max(0, -(-(header.height - row) // row_step))
        if width and height:
            total += height * (1 + _row_bytes(width, header))
    return total


def _inflated_size(data: bytes, limit: int) -> int:
    """How many bytes the IDAT chunks inflate to, counted up to just past `limit` in bounded
    memory (`data` has decoded once already, so its chunks are well formed)."""
    stream = zlib.decompressobj()
    pending = b"".join(_idat_payloads(data))
    found = 0
    try:
        while pending and not stream.eof and found <= limit:
            found += len(stream.decompress(pending, _INFLATE_STEP))
            pending = stream.unconsumed_tail
    except zlib.error as exc:
        raise RejectedError(ReasonCode.IMAGE_UNDECODABLE, f"the PNG's pixel data is corrupt: {exc}") from exc
    return found


def _idat_payloads(data: bytes) -> Iterator[bytes]:
    at = len(PNG_SIGNATURE)
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at : at + 8])
        if kind == b"IDAT":
            yield data[at + 8 : at + 8 + length]
        elif kind == b"IEND":
            return
        at += 12 + length


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
