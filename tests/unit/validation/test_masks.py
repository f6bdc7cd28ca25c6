"""An annotator's masks: class ids in one 8-bit channel, nothing else."""

from __future__ import annotations

import pytest

from functions.common.taxonomy import Taxonomy
from functions.validation import (
    FileCheck,
    InMemoryContentIndex,
    ReasonCode,
    Status,
    ValidationConfig,
    check_label,
    validate_pair,
)

from .corpus import SIZE, encode, gray_png, jpeg, mask, mask_image, palette_mask, raw_png, scanlines, short_png


def only_reason(check: FileCheck) -> ReasonCode:
    assert len(check.reasons) == 1, check.reasons
    return check.reasons[0].code


def test_a_class_id_mask_is_counted_per_class() -> None:
    check = check_label(mask(regions={10: 8, 13: 4}, fill=0), "labels/a.png")

    assert check.ok, check.reasons
    assert check.value_pixels == {0: 52 * 32, 10: 8 * 32, 13: 4 * 32}


def test_an_accepted_pair_reports_pixels_per_class_name() -> None:
    result = validate_pair(jpeg(), "images/a.jpg", mask(fill=255, regions={0: 10, 13: 6}), "labels/a.png")

    assert result.status is Status.VALID
    assert result.class_pixels == {"road": 320, "car": 192}
    assert result.ignore_pixels == 64 * 32 - 320 - 192
    assert (result.width, result.height) == SIZE


def test_a_palette_mask_whose_indices_are_class_ids_is_accepted() -> None:
    result = validate_pair(jpeg(), "images/a.jpg", palette_mask(regions={18: 5}), "labels/a.png")

    assert result.status is Status.VALID, result.reasons
    assert result.class_pixels == {"road": 59 * 32, "bicycle": 5 * 32}


def test_a_4_bit_palette_mask_is_still_indices() -> None:
    indexed = mask_image(regions={3: 5}).convert("P")
    indexed.putpalette([value for i in range(16) for value in (i * 16, i, 0)])

    check = check_label(encode(indexed, "PNG", bits=4), "labels/small-palette.png")

    assert check.ok, check.reasons
    assert check.value_pixels == {0: 59 * 32, 3: 5 * 32}


@pytest.mark.parametrize(("mode", "named"), [("RGB", "RGB"), ("RGBA", "RGBA"), ("LA", "alpha")])
def test_an_annotator_uploads_a_color_mask_instead_of_class_ids(mode: str, named: str) -> None:
    check = check_label(encode(mask_image().convert(mode), "PNG"), "labels/color.png")

    assert only_reason(check) is ReasonCode.MASK_NOT_SINGLE_CHANNEL
    assert named in check.reasons[0].message


def test_a_16_bit_mask_is_not_8_bit() -> None:
    check = check_label(encode(mask_image().convert("I;16"), "PNG"), "labels/deep.png")

    assert only_reason(check) is ReasonCode.MASK_NOT_8BIT
    assert "16-bit" in check.reasons[0].message


def test_a_1_bit_mask_is_not_8_bit() -> None:
    check = check_label(encode(mask_image(regions={1: 4}).convert("1"), "PNG"), "labels/bits.png")

    assert only_reason(check) is ReasonCode.MASK_NOT_8BIT


def test_a_4_bit_grayscale_mask_would_be_rescaled_by_the_decoder() -> None:
    # Pillow widens 4-bit gray to 8 bits (value 1 becomes 17), so its ids cannot be trusted.
    check = check_label(raw_png(64, 32, bit_depth=4), "labels/nibbles.png")

    assert only_reason(check) is ReasonCode.MASK_NOT_8BIT
    assert "4-bit" in check.reasons[0].message


def test_a_mask_with_values_outside_the_taxonomy_names_them() -> None:
    check = check_label(mask(regions={19: 2, 42: 1, 5: 3}), "labels/unknown.png")

    assert only_reason(check) is ReasonCode.MASK_UNKNOWN_CLASS
    message = check.reasons[0].message
    assert "19 (64 px)" in message and "42 (32 px)" in message and " 5 " not in message
    assert "0-18" in message and "255" in message


def test_cityscapes_label_ids_instead_of_train_ids_get_a_hint() -> None:
    check = check_label(mask(regions={7: 4, 26: 4, 33: 2}), "labels/label-ids.png")

    assert only_reason(check) is ReasonCode.MASK_UNKNOWN_CLASS
    assert "labelIds" in check.reasons[0].message


def test_a_palette_mask_with_an_index_beyond_the_classes() -> None:
    check = check_label(palette_mask(regions={77: 3}), "labels/p.png")

    assert only_reason(check) is ReasonCode.MASK_UNKNOWN_CLASS
    assert "77 (96 px)" in check.reasons[0].message


def test_a_mask_with_every_pixel_ignored_labels_nothing() -> None:
    check = check_label(mask(fill=255, regions={}), "labels/blank.png")

    assert only_reason(check) is ReasonCode.MASK_ALL_IGNORE
    assert "2048" in check.reasons[0].message


def test_a_mask_of_another_size_than_its_image() -> None:
    result = validate_pair(jpeg(size=(64, 32)), "images/a.jpg", mask(size=(32, 32)), "labels/a.png")

    assert result.status is Status.INVALID
    assert [reason.code for reason in result.reasons] == [ReasonCode.MASK_SIZE_MISMATCH]
    assert "64x32" in result.reasons[0].message and "32x32" in result.reasons[0].message


def test_a_mask_saved_as_jpeg_is_refused_by_its_name() -> None:
    check = check_label(encode(mask_image(), "JPEG"), "labels/lossy.jpg")

    assert only_reason(check) is ReasonCode.UNSUPPORTED_EXTENSION


def test_a_jpeg_mask_renamed_to_png_is_caught_by_its_content() -> None:
    check = check_label(encode(mask_image(), "JPEG"), "labels/lossy.png")

    assert only_reason(check) is ReasonCode.EXTENSION_MISMATCH


def test_a_deployment_with_its_own_taxonomy_checks_against_it() -> None:
    config = ValidationConfig(taxonomy=Taxonomy(classes=("road", "car", "person")))

    good = check_label(mask(regions={2: 4}), "labels/a.png", config)
    bad = check_label(mask(regions={3: 4}), "labels/b.png", config)

    assert good.ok
    assert only_reason(bad) is ReasonCode.MASK_UNKNOWN_CLASS
    assert "0-2" in bad.reasons[0].message


def test_an_empty_mask_file() -> None:
    assert only_reason(check_label(b"", "labels/a.png")) is ReasonCode.EMPTY_FILE


def test_both_files_of_a_pair_report_their_own_defects() -> None:
    result = validate_pair(
        jpeg()[:200],
        "images/a.jpg",
        mask(regions={99: 1}),
        "labels/a.png",
        index=InMemoryContentIndex(),
    )

    assert result.status is Status.INVALID
    assert [(r.code, r.key) for r in result.reasons] == [
        (ReasonCode.IMAGE_TRUNCATED, "images/a.jpg"),
        (ReasonCode.MASK_UNKNOWN_CLASS, "labels/a.png"),
    ]


def test_a_mask_whose_compressed_rows_stop_early_but_cleanly_is_rejected() -> None:
    # The zlib stream is whole and valid, so no decoder complains: the 12 missing rows would
    # simply read as 0, road, under the car and the sky.
    check = check_label(short_png(mask_image(fill=1), rows=20), "labels/short.png")

    assert only_reason(check) is ReasonCode.IMAGE_ROWS_MISSING
    assert "20 of its 32 rows" in check.reasons[0].message


def test_the_same_mask_written_in_full_is_valid() -> None:
    whole = mask_image(fill=1)

    check = check_label(short_png(whole, rows=32), "labels/whole.png")

    assert check.ok, check.reasons
    assert check.value_pixels == check_label(encode(whole, "PNG"), "labels/pillow.png").value_pixels


def test_a_mask_whose_clean_stream_stops_inside_a_row_is_truncated() -> None:
    # Pillow itself refuses a row left half written, so this one never reaches the row check.
    gray = mask_image()
    cut = gray_png(gray.size, scanlines(gray)[: 7 * 65 + 30])

    assert only_reason(check_label(cut, "labels/short.png")) is ReasonCode.IMAGE_TRUNCATED


@pytest.mark.parametrize("height", [32, 33])
def test_an_interlaced_mask_must_hold_its_last_pass(height: int) -> None:
    gray = mask_image(size=(64, height))
    data = scanlines(gray, interlaced=True)

    whole = check_label(gray_png(gray.size, data, interlaced=True), "labels/adam7.png")
    short = check_label(gray_png(gray.size, data[:-65], interlaced=True), "labels/adam7.png")

    assert whole.ok, whole.reasons
    assert whole.value_pixels == check_label(encode(gray, "PNG"), "labels/plain.png").value_pixels
    assert only_reason(short) is ReasonCode.IMAGE_ROWS_MISSING
    assert "interlaced" in short.reasons[0].message


def test_a_whole_mask_whose_last_row_looks_unwritten_is_judged_by_its_values() -> None:
    # The last row holds exactly what unwritten pixels are preset to: the byte count decides.
    gray = mask_image()
    gray.paste(254, (0, 31, 64, 32))

    check = check_label(short_png(gray, rows=32), "labels/odd.png")

    assert only_reason(check) is ReasonCode.MASK_UNKNOWN_CLASS
    assert "254 (64 px)" in check.reasons[0].message
