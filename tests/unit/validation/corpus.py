"""Test corpus, generated in code: small images, masks and hand-built hostile files."""

from __future__ import annotations

import io
import struct
import zlib
from typing import Any

from PIL import Image

from functions.common.taxonomy import CITYSCAPES_COLORS

SIZE = (64, 32)  # small, and within the default minimum of 32x32


def encode(image: Image.Image, fmt: str, **options: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def scene(size: tuple[int, int] = SIZE, mode: str = "RGB") -> Image.Image:
    """A street-ish picture: sky, road and a car, with some texture so JPEG has work to do."""
    picture = Image.linear_gradient("L").resize(size).convert("RGB")
    picture.paste((70, 130, 180), (0, 0, size[0], size[1] // 3))
    picture.paste((0, 0, 142), (size[0] // 4, size[1] // 2, size[0] // 2, size[1] - 2))
    return picture.convert(mode)


def jpeg(size: tuple[int, int] = SIZE, mode: str = "RGB", **options: Any) -> bytes:
    return encode(scene(size, mode), "JPEG", quality=90, **options)


def png(size: tuple[int, int] = SIZE, mode: str = "RGB", **options: Any) -> bytes:
    return encode(scene(size, mode), "PNG", **options)


def mask_image(size: tuple[int, int] = SIZE, fill: int = 0, regions: dict[int, int] | None = None) -> Image.Image:
    """A class-id mask: `fill` everywhere, plus one vertical band per {value: width}."""
    mask = Image.new("L", size, fill)
    left = 0
    for value, width in (regions if regions is not None else {10: 8, 13: 4}).items():
        mask.paste(value, (left, 0, left + width, size[1]))
        left += width
    return mask


def mask(size: tuple[int, int] = SIZE, fill: int = 0, regions: dict[int, int] | None = None) -> bytes:
    return encode(mask_image(size, fill, regions), "PNG")


def palette_mask(size: tuple[int, int] = SIZE, regions: dict[int, int] | None = None) -> bytes:
    """A palette PNG whose indices are class ids, colored like Cityscapes for people."""
    indexed = mask_image(size, 0, regions).convert("P")
    colors = [channel for color in CITYSCAPES_COLORS for channel in color]
    indexed.putpalette(colors + [0] * (768 - len(colors)))
    return encode(indexed, "PNG")


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def raw_png(
    width: int,
    height: int,
    *,
    bit_depth: int = 8,
    color_type: int = 0,
    rows: bytes | None = None,
    before_idat: bytes = b"",
) -> bytes:
    """A PNG written byte by byte, for headers no encoder would write."""
    header = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    if rows is None:
        row_bytes = (width * bit_depth * {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color_type] + 7) // 8
        rows = (b"\x00" + b"\x00" * row_bytes) * min(height, 64)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + before_idat
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def filled_png(width: int, height: int) -> bytes:
    """A real bomb: every row present, all zeros, so decoding it would really take the memory."""
    compressor = zlib.compressobj(9)
    row = b"\x00" * (width + 1)
    idat = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


# Adam7's passes: first column, first row, column step, row step.
ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def scanlines(gray: Image.Image, *, interlaced: bool = False) -> bytes:
    """An L image's pixel data as a PNG holds it before compression: rows of a filter byte
    (0, none) and the pixels; pass after pass for Adam7."""
    width, height = gray.size
    pixels = gray.tobytes()
    rows = [pixels[y * width : (y + 1) * width] for y in range(height)]
    if not interlaced:
        return b"".join(b"\x00" + row for row in rows)
    data = b""
    for column, first, column_step, row_step in ADAM7:
        if column < width:
            data += b"".join(b"\x00" + rows[y][column::column_step] for y in range(first, height, row_step))
    return data


def gray_png(size: tuple[int, int], pixel_data: bytes, *, interlaced: bool = False) -> bytes:
    """An 8-bit gray PNG of exactly `pixel_data` in one zlib stream that ends cleanly, however
    short of the header's `size` the data are: what an encoder that stops early writes."""
    header = struct.pack(">IIBBBBB", *size, 8, 0, 0, 0, int(interlaced))
    idat = chunk(b"IDAT", zlib.compress(pixel_data))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + idat + chunk(b"IEND", b"")


def short_png(gray: Image.Image, rows: int) -> bytes:
    """`gray` as a PNG whose complete, valid zlib stream holds only its first `rows` rows."""
    return gray_png(gray.size, scanlines(gray)[: rows * (1 + gray.width)])


def exif(orientation: int) -> Image.Exif:
    tags = Image.Exif()
    tags[0x0112] = orientation  # Orientation
    return tags


def oriented_jpeg(orientation: int, size: tuple[int, int] = SIZE) -> bytes:
    """A photo as a phone stores it: pixels as the sensor read them, EXIF says how to turn them."""
    return encode(scene(size), "JPEG", quality=90, exif=exif(orientation))


def animated_png(size: tuple[int, int] = SIZE) -> bytes:
    frames = [scene(size), scene(size).rotate(180)]
    return encode(frames[0], "PNG", save_all=True, append_images=frames[1:])


def with_jpeg_size(data: bytes, width: int, height: int) -> bytes:
    """A real JPEG whose start-of-frame header declares another size."""
    at = data.index(b"\xff\xc0") + 5  # marker, length (2), precision (1)
    return data[:at] + struct.pack(">HH", height, width) + data[at + 4 :]


def many_scans_jpeg(size: tuple[int, int] = (6000, 6000), scans: int = 4000) -> bytes:
    """A valid progressive grayscale JPEG followed by `scans` more AC scans of its one component:
    the crafted file of the security review. Each scan is a dozen bytes of header and a few EOB
    runs (one Huffman symbol skips up to 32,767 blocks), yet libjpeg walks every block of the
    image for it: 4,000 scans of 6000x6000 are 381 KB, far within the size caps, and hold Pillow
    for seconds per hundred scans. libjpeg accepts the repeated scans: each one's Ah (0) matches
    the state the one before left, so not even a warning."""
    width, height = size
    base = encode(Image.new("L", size, 128), "JPEG", progressive=True, quality=90)
    assert base.endswith(b"\xff\xd9")

    def segment(marker: int, payload: bytes) -> bytes:
        return struct.pack(">BBH", 0xFF, marker, len(payload) + 2) + payload

    # AC table 1: EOB14 (0xE0) is code 0, EOB0 (0x00) code 10; EOB14 and 14 one-bits: 32,767 blocks.
    table = segment(0xC4, bytes([0x11, 1, 1, *[0] * 14, 0xE0, 0x00]))
    blocks = -(-width // 8) * -(-height // 8)
    bits = "0" + "1" * 14
    stream = bits * -(-blocks // 32767)
    stream += "1" * (-len(stream) % 8)
    entropy = int(stream, 2).to_bytes(len(stream) // 8, "big").replace(b"\xff", b"\xff\x00")
    # Component 1, DC table 0 and AC table 1, coefficients 1-63, first pass (Ah 0, Al 0).
    scan = segment(0xDA, bytes([1, 1, 0x01, 1, 63, 0x00])) + entropy
    return base[:-2] + table + scan * scans + b"\xff\xd9"
