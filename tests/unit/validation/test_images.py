"""An annotator's images: what is accepted, and what each broken upload is told."""

from __future__ import annotations

import io

import pytest

from functions.validation import FileCheck, ReasonCode, ValidationConfig, check_image

from .corpus import SIZE, animated_png, chunk, encode, exif, jpeg, oriented_jpeg, png, raw_png, scene, short_png


def only_reason(check: FileCheck) -> ReasonCode:
    assert len(check.reasons) == 1, check.reasons
    return check.reasons[0].code


@pytest.mark.parametrize(
    ("key", "data"),
    [
        ("images/rgb.jpg", jpeg()),
        ("images/gray.jpg", jpeg(mode="L")),
        ("images/UPPER.JPG", jpeg()),
        ("images/long.jpeg", jpeg()),
        ("images/rgb.png", png()),
        ("images/gray.png", png(mode="L")),
        ("images/progressive.jpg", jpeg(progressive=True)),
    ],
)
def test_an_annotator_uploads_a_good_image_in_every_accepted_variant(key: str, data: bytes) -> None:
    check = check_image(data, key)

    assert check.ok, check.reasons
    assert (check.width, check.height) == SIZE
    assert check.mode in {"RGB", "L"}
    assert check.sha256 is not None and len(check.sha256) == 64


def test_an_image_can_be_read_from_a_binary_file_object() -> None:
    assert check_image(io.BytesIO(jpeg()), "images/stream.jpg").ok


class Trickle(io.BytesIO):
    """A network body that hands out a few bytes per read, as sockets may."""

    def read(self, size: int | None = -1, /) -> bytes:
        return super().read(min(7, size) if size is not None and size >= 0 else 7)


def test_an_image_streamed_a_few_bytes_at_a_time_is_read_whole() -> None:
    assert check_image(Trickle(jpeg()), "images/slow.jpg").ok


def test_an_annotator_uploads_a_truncated_jpeg() -> None:
    data = jpeg()

    check = check_image(data[: len(data) * 2 // 3], "images/cut.jpg")

    assert only_reason(check) is ReasonCode.IMAGE_TRUNCATED
    assert (check.width, check.height) == SIZE  # the header survived, and is reported


def test_an_upload_of_a_jpeg_stops_inside_its_header() -> None:
    assert only_reason(check_image(jpeg()[:40], "images/cut.jpg")) is ReasonCode.IMAGE_TRUNCATED


def test_an_annotator_uploads_a_png_cut_inside_its_pixel_data() -> None:
    data = png(mode="L", size=(256, 256))

    check = check_image(data[: len(data) // 2], "images/cut.png")

    assert only_reason(check) is ReasonCode.IMAGE_TRUNCATED


def test_a_png_that_lost_only_its_end_chunk_is_still_truncated() -> None:
    data = png()

    check = check_image(data[:-12], "images/no-iend.png")

    assert only_reason(check) is ReasonCode.IMAGE_TRUNCATED
    assert "IEND" in check.reasons[0].message


def test_a_png_upload_stops_inside_its_header() -> None:
    assert only_reason(check_image(png()[:20], "images/cut.png")) is ReasonCode.IMAGE_TRUNCATED


def test_an_annotator_uploads_a_zero_byte_image() -> None:
    assert only_reason(check_image(b"", "images/empty.jpg")) is ReasonCode.EMPTY_FILE


def test_an_html_error_page_is_saved_under_an_image_name() -> None:
    check = check_image(b"<!DOCTYPE html><title>403 Forbidden</title>", "images/page.jpg")

    assert only_reason(check) is ReasonCode.NOT_AN_IMAGE
    assert "3c 21 44 4f" in check.reasons[0].message  # the first bytes, in hex


@pytest.mark.parametrize(("fmt", "name"), [("GIF", "GIF"), ("BMP", "BMP"), ("WEBP", "WEBP"), ("TIFF", "TIFF")])
def test_an_image_in_another_format_is_named_png(fmt: str, name: str) -> None:
    check = check_image(encode(scene(), fmt), "images/other.png")

    assert only_reason(check) is ReasonCode.UNSUPPORTED_FORMAT
    assert name in check.reasons[0].message


def test_a_jpeg_is_renamed_to_png() -> None:
    check = check_image(jpeg(), "images/renamed.png")

    assert only_reason(check) is ReasonCode.EXTENSION_MISMATCH
    assert ".png" in check.reasons[0].message and "JPEG" in check.reasons[0].message


@pytest.mark.parametrize("key", ["images/photo.bmp", "images/photo", "images/photo.jpg.txt", "images/.jpg"])
def test_an_image_with_an_unknown_extension_is_not_opened(key: str) -> None:
    assert only_reason(check_image(jpeg(), key)) is ReasonCode.UNSUPPORTED_EXTENSION


@pytest.mark.parametrize(
    ("data", "mode"),
    [
        (encode(scene(mode="CMYK"), "JPEG"), "CMYK"),
        (png(mode="RGBA"), "RGBA"),
        (png(mode="LA"), "LA"),
        (png(mode="P"), "P"),
        (png(mode="1"), "1"),
        (encode(scene().convert("I;16"), "PNG"), "I;16"),
    ],
)
def test_an_image_in_an_unsupported_mode_is_named_by_its_mode(data: bytes, mode: str) -> None:
    check = check_image(data, "images/odd.png" if data.startswith(b"\x89PNG") else "images/odd.jpg")

    assert only_reason(check) is ReasonCode.IMAGE_MODE_UNSUPPORTED
    assert f"mode {mode} " in check.reasons[0].message


def test_a_thumbnail_is_too_small_to_train_on() -> None:
    check = check_image(jpeg(size=(16, 16)), "images/thumb.jpg")

    assert only_reason(check) is ReasonCode.IMAGE_TOO_SMALL
    assert "16x16" in check.reasons[0].message


def test_an_image_beyond_the_configured_bounds_is_too_large() -> None:
    config = ValidationConfig(max_width=48)

    check = check_image(jpeg(), "images/wide.jpg", config)

    assert only_reason(check) is ReasonCode.IMAGE_TOO_LARGE
    assert "64x32" in check.reasons[0].message and "48x8192" in check.reasons[0].message


def test_an_animated_png_is_not_one_picture() -> None:
    check = check_image(animated_png(), "images/anim.png")

    assert only_reason(check) is ReasonCode.IMAGE_ANIMATED
    assert "2 frames" in check.reasons[0].message


def test_a_bit_flip_in_a_png_header_makes_it_undecodable() -> None:
    data = bytearray(png())
    data[20] ^= 0xFF  # inside IHDR: its CRC no longer matches

    assert only_reason(check_image(bytes(data), "images/flip.png")) is ReasonCode.IMAGE_UNDECODABLE


def test_a_png_whose_pixel_data_is_not_zlib_is_undecodable() -> None:
    good = raw_png(64, 32, color_type=2)
    idat_at = good.index(b"IDAT") - 4
    broken = good[:idat_at] + chunk(b"IDAT", b"\x78\x9c" + b"\xff" * 200) + chunk(b"IEND", b"")

    assert only_reason(check_image(broken, "images/garbage.png")) is ReasonCode.IMAGE_UNDECODABLE


def test_a_file_above_the_byte_limit_is_not_read_whole() -> None:
    config = ValidationConfig(max_file_bytes=1000)
    stream = io.BytesIO(png(size=(256, 256)))

    check = check_image(stream, "images/big.png", config)

    assert only_reason(check) is ReasonCode.FILE_TOO_LARGE
    assert stream.tell() == 1001  # one byte past the limit proves the point, no more


def test_a_truncated_image_still_reports_its_hash_for_the_ledger() -> None:
    data = jpeg()[:300]

    check = check_image(data, "images/cut.jpg")

    assert check.size_bytes == 300 and check.sha256 is not None


def test_a_png_image_whose_compressed_rows_stop_early_but_cleanly_is_rejected() -> None:
    check = check_image(short_png(scene(mode="L"), rows=31), "images/short.png")

    assert only_reason(check) is ReasonCode.IMAGE_ROWS_MISSING
    assert "31 of its 32 rows" in check.reasons[0].message and "other 1 " in check.reasons[0].message


def test_a_whole_png_image_whose_last_row_is_the_preset_value_is_valid() -> None:
    gray = scene(mode="L")
    gray.paste(254, (0, 31, 64, 32))  # what unwritten pixels are preset to: counted, not guessed

    assert check_image(short_png(gray, rows=32), "images/bright-edge.png").ok


def test_a_photo_whose_exif_turns_it_for_display_is_rejected() -> None:
    check = check_image(oriented_jpeg(6), "images/portrait.jpg")

    assert only_reason(check) is ReasonCode.IMAGE_EXIF_ROTATED
    message = check.reasons[0].message
    assert "orientation 6" in message and "90 degrees clockwise" in message
    assert "re-export the photo with its rotation applied" in message
    assert (check.width, check.height) == SIZE  # the stored size, as the trainer sees it


def test_a_photo_whose_exif_orientation_is_upright_is_valid() -> None:
    assert check_image(oriented_jpeg(1), "images/upright.jpg").ok


@pytest.mark.parametrize("orientation", [2, 3, 4, 5, 7, 8])
def test_every_turn_or_mirror_is_rejected_even_those_that_keep_the_size(orientation: int) -> None:
    check = check_image(oriented_jpeg(orientation), "images/turned.jpg")

    assert only_reason(check) is ReasonCode.IMAGE_EXIF_ROTATED
    assert f"orientation {orientation}:" in check.reasons[0].message


@pytest.mark.parametrize("after_pixels", [False, True])
def test_a_png_with_an_exif_chunk_is_checked_too(after_pixels: bool) -> None:
    data = png()
    at = data.index(b"IEND" if after_pixels else b"IDAT") - 4
    data = data[:at] + chunk(b"eXIf", exif(8).tobytes()[6:]) + data[at:]  # TIFF, no Exif\0\0

    check = check_image(data, "images/turned.png")

    assert only_reason(check) is ReasonCode.IMAGE_EXIF_ROTATED
    assert "orientation 8:" in check.reasons[0].message


@pytest.mark.parametrize("orientation", [0, 9])
def test_an_orientation_no_viewer_applies_is_no_turn(orientation: int) -> None:
    assert check_image(oriented_jpeg(orientation), "images/odd.jpg").ok


def test_unreadable_exif_is_ignored_like_viewers_ignore_it() -> None:
    data = encode(scene(), "JPEG", exif=b"Exif\x00\x00not a tiff header")

    assert check_image(data, "images/junk-exif.jpg").ok
