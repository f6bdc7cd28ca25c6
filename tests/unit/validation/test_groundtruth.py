"""A Ground Truth labeling job's output: colors through the manifest's color map, names through
the configured class map, sources only from allowed places."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from PIL import Image

from functions.validation import (
    InMemoryContentIndex,
    ObjectMissingError,
    PairResult,
    ReasonCode,
    S3Location,
    Status,
    ValidationConfig,
    validate_manifest,
)

from .corpus import SIZE, encode, jpeg, oriented_jpeg, short_png

BUCKET = "annotations"
JOB = "street-scenes"
COLOR_MAP = {
    "0": {"class-name": "BACKGROUND", "hex-color": "#ffffff", "confidence": 0.9},
    "1": {"class-name": "road", "hex-color": "#804080", "confidence": 0.9},
    "2": {"class-name": "Vehicle", "hex-color": "#00008e", "confidence": 0.9},
}
CONFIG = ValidationConfig(
    groundtruth_class_map={"BACKGROUND": None, "Vehicle": "car"},
    allowed_sources=(f"s3://{BUCKET}/raw/", f"s3://{BUCKET}/output/"),
)


def color_mask(colors: dict[tuple[int, int, int], int], size: tuple[int, int] = SIZE) -> Image.Image:
    """White background plus one vertical band per {color: width}."""
    mask = Image.new("RGB", size, (255, 255, 255))
    left = 0
    for color, width in colors.items():
        mask.paste(color, (left, 0, left + width, size[1]))
        left += width
    return mask


ROAD, CAR = (0x80, 0x40, 0x80), (0x00, 0x00, 0x8E)


def line(stem: str, **overrides: Any) -> str:
    record = {
        "source-ref": f"s3://{BUCKET}/raw/{stem}.jpg",
        f"{JOB}-ref": f"s3://{BUCKET}/output/{JOB}/annotations/{stem}.png",
        f"{JOB}-ref-metadata": {
            "internal-color-map": COLOR_MAP,
            "type": "groundtruth/semantic-segmentation",
            "human-annotated": "yes",
            "creation-date": "2026-05-01T10:00:00.000000",
            "job-name": f"labeling-job/{JOB}",
        },
    }
    record.update(overrides)
    return json.dumps(record)


class Bucket:
    """S3 as a dict, read like the intake would read it."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], bytes] = {}

    def put(self, uri: str, data: bytes) -> None:
        location = S3Location.parse(uri)
        self.objects[(location.bucket, location.key)] = data

    def put_pair(self, stem: str, image: bytes, mask: bytes) -> None:
        self.put(f"s3://{BUCKET}/raw/{stem}.jpg", image)
        self.put(f"s3://{BUCKET}/output/{JOB}/annotations/{stem}.png", mask)

    def read(self, location: S3Location, limit: int) -> bytes:
        if (location.bucket, location.key) not in self.objects:
            raise ObjectMissingError(f"NoSuchKey: {location.uri}")
        return self.objects[(location.bucket, location.key)][: limit + 1]


def validate(bucket: Bucket, *lines: str, config: ValidationConfig = CONFIG) -> list[PairResult]:
    return list(validate_manifest(lines, "output.manifest", bucket, config=config, index=InMemoryContentIndex()))


def codes(result: PairResult) -> list[ReasonCode]:
    return [reason.code for reason in result.reasons]


@pytest.fixture
def bucket() -> Bucket:
    return Bucket()


def test_a_labeling_jobs_rgb_mask_is_counted_per_taxonomy_class(bucket: Bucket) -> None:
    bucket.put_pair("a", jpeg(), encode(color_mask({ROAD: 10, CAR: 4}), "PNG"))

    [result] = validate(bucket, line("a"))

    assert result.status is Status.VALID, result.reasons
    assert result.item == "output.manifest:1"
    assert result.image == f"s3://{BUCKET}/raw/a.jpg"
    assert result.class_pixels == {"road": 320, "car": 128}
    assert result.ignore_pixels == 50 * 32


def test_a_palette_mask_is_read_by_color_not_by_index(bucket: Bucket) -> None:
    # Indices deliberately disagree with the color map's keys; the colors are what count.
    indexed = color_mask({ROAD: 10, CAR: 4}).quantize(colors=3)
    bucket.put_pair("a", jpeg(), encode(indexed, "PNG"))

    [result] = validate(bucket, line("a"))

    assert result.status is Status.VALID, result.reasons
    assert result.class_pixels == {"road": 320, "car": 128}


def test_an_rgba_mask_is_read_by_its_colors(bucket: Bucket) -> None:
    bucket.put_pair("a", jpeg(), encode(color_mask({ROAD: 10}).convert("RGBA"), "PNG"))

    [result] = validate(bucket, line("a"))

    assert result.status is Status.VALID, result.reasons


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not an object"),
        (json.dumps({"source-ref": "s3://annotations/raw/a.jpg"}), "no semantic-segmentation"),
        (line("a", **{"source-ref": 7}), "source-ref"),
        (
            json.dumps(
                {
                    "source-ref": "s3://annotations/raw/a.jpg",
                    f"{JOB}-ref-metadata": {"failure-reason": "ClientError: worker timed out"},
                }
            ),
            "worker timed out",
        ),
        (
            line("a", **{f"{JOB}-ref-metadata": {"type": "groundtruth/semantic-segmentation"}}),
            "internal-color-map",
        ),
    ],
)
def test_a_manifest_line_that_is_no_segmentation_entry(bucket: Bucket, text: str, problem: str) -> None:
    [result] = validate(bucket, text)

    assert result.status is Status.INVALID
    assert codes(result) == [ReasonCode.MANIFEST_ENTRY_INVALID]
    assert problem in result.reasons[0].message


def test_a_color_map_with_a_malformed_color(bucket: Bucket) -> None:
    broken = {"0": {"class-name": "road", "hex-color": "purple"}}
    metadata = {"internal-color-map": broken, "type": "groundtruth/semantic-segmentation"}

    [result] = validate(bucket, line("a", **{f"{JOB}-ref-metadata": metadata}))

    assert codes(result) == [ReasonCode.MANIFEST_ENTRY_INVALID]
    assert "'purple'" in result.reasons[0].message


@pytest.mark.parametrize(
    "uri",
    [
        "s3://someone-elses-bucket/raw/a.jpg",
        f"s3://{BUCKET}/raw-private/a.jpg",  # shares a prefix string, not a folder
        f"s3://{BUCKET}/a.jpg",
        "file:///etc/passwd",
        "https://example.com/a.jpg",
        "s3://annotations",
        "s3://Bad_Bucket/raw/a.jpg",
    ],
)
def test_a_manifest_pointing_outside_the_allowed_locations(bucket: Bucket, uri: str) -> None:
    bucket.put_pair("a", jpeg(), encode(color_mask({ROAD: 10}), "PNG"))

    [result] = validate(bucket, line("a", **{"source-ref": uri}))

    assert result.status is Status.INVALID
    assert codes(result) == [ReasonCode.SOURCE_NOT_ALLOWED]
    assert result.reasons[0].key == uri


def test_with_no_allowed_locations_configured_nothing_is_read(bucket: Bucket) -> None:
    bucket.put_pair("a", jpeg(), encode(color_mask({ROAD: 10}), "PNG"))

    [result] = validate(bucket, line("a"), config=ValidationConfig())

    assert codes(result) == [ReasonCode.SOURCE_NOT_ALLOWED, ReasonCode.SOURCE_NOT_ALLOWED]
    assert "none configured" in result.reasons[0].message


def test_a_manifest_climbing_out_of_an_allowed_prefix(bucket: Bucket) -> None:
    [result] = validate(bucket, line("a", **{"source-ref": f"s3://{BUCKET}/raw/../secret/a.jpg"}))

    assert codes(result)[0] is ReasonCode.UNSAFE_NAME


def test_anti_aliased_edges_bring_colors_the_color_map_lacks(bucket: Bucket) -> None:
    bucket.put_pair("a", jpeg(), encode(color_mask({ROAD: 10, (0x40, 0x20, 0x88): 2}), "PNG"))

    [result] = validate(bucket, line("a"))

    assert codes(result) == [ReasonCode.MASK_UNKNOWN_COLOR]
    assert "#402088 (64 px)" in result.reasons[0].message


def test_a_photo_saved_as_the_mask_has_too_many_colors(bucket: Bucket) -> None:
    photo = Image.frombytes("RGB", SIZE, random.Random(0).randbytes(SIZE[0] * SIZE[1] * 3))
    bucket.put_pair("a", jpeg(), encode(photo, "PNG"))

    [result] = validate(bucket, line("a"))

    assert codes(result) == [ReasonCode.MASK_UNKNOWN_COLOR]
    assert "more than 1024 distinct colors" in result.reasons[0].message


def test_a_class_the_taxonomy_does_not_know_must_be_mapped(bucket: Bucket) -> None:
    color_map = {**COLOR_MAP, "3": {"class-name": "pothole", "hex-color": "#123456"}}
    metadata = {"internal-color-map": color_map, "type": "groundtruth/semantic-segmentation"}
    bucket.put_pair("a", jpeg(), encode(color_mask({ROAD: 10, (0x12, 0x34, 0x56): 3}), "PNG"))

    [result] = validate(bucket, line("a", **{f"{JOB}-ref-metadata": metadata}))

    assert codes(result) == [ReasonCode.CLASS_NOT_MAPPED]
    assert "'pothole' (96 px)" in result.reasons[0].message


def test_an_unmapped_class_that_paints_no_pixel_is_harmless(bucket: Bucket) -> None:
    color_map = {**COLOR_MAP, "3": {"class-name": "pothole", "hex-color": "#123456"}}
    metadata = {"internal-color-map": color_map, "type": "groundtruth/semantic-segmentation"}
    bucket.put_pair("a", jpeg(), encode(color_mask({ROAD: 10}), "PNG"))

    [result] = validate(bucket, line("a", **{f"{JOB}-ref-metadata": metadata}))

    assert result.status is Status.VALID


def test_a_task_the_worker_left_all_background_labels_nothing(bucket: Bucket) -> None:
    bucket.put_pair("a", jpeg(), encode(color_mask({}), "PNG"))

    [result] = validate(bucket, line("a"))

    assert codes(result) == [ReasonCode.MASK_ALL_IGNORE]


def test_a_mask_whose_image_was_deleted_from_the_bucket(bucket: Bucket) -> None:
    bucket.put(f"s3://{BUCKET}/output/{JOB}/annotations/a.png", encode(color_mask({ROAD: 4}), "PNG"))

    [result] = validate(bucket, line("a"))

    assert result.status is Status.INCOMPLETE
    assert codes(result) == [ReasonCode.MISSING_IMAGE]
    assert "NoSuchKey" in result.reasons[0].message


def test_the_same_photo_in_two_tasks_is_a_duplicate(bucket: Bucket) -> None:
    photo = jpeg()
    bucket.put_pair("a", photo, encode(color_mask({ROAD: 4}), "PNG"))
    bucket.put_pair("b", photo, encode(color_mask({CAR: 4}), "PNG"))

    first, second = validate(bucket, line("a"), "", line("b"))

    assert (first.status, second.status) == (Status.VALID, Status.DUPLICATE)
    assert second.item == "output.manifest:3"  # the blank line 2 counts but is no item
    assert second.duplicate_of == f"s3://{BUCKET}/raw/a.jpg"


def test_a_broken_image_is_named_by_its_uri(bucket: Bucket) -> None:
    bucket.put_pair("a", jpeg()[:300], encode(color_mask({ROAD: 4}), "PNG"))

    [result] = validate(bucket, line("a"))

    assert codes(result) == [ReasonCode.IMAGE_TRUNCATED]
    assert result.reasons[0].key == f"s3://{BUCKET}/raw/a.jpg"


def test_a_class_map_may_only_target_taxonomy_classes() -> None:
    with pytest.raises(ValueError, match="automobile"):
        ValidationConfig(groundtruth_class_map={"Vehicle": "automobile"})


def test_a_mask_whose_rows_stop_early_is_rejected_not_read_as_black(bucket: Bucket) -> None:
    # Gray 255 is BACKGROUND's white; without the check the missing rows would read as black,
    # a color the map does not have, and the annotator would be told the wrong defect.
    bucket.put_pair("a", jpeg(), short_png(Image.new("L", SIZE, 255), rows=16))

    [result] = validate(bucket, line("a"))

    assert codes(result) == [ReasonCode.IMAGE_ROWS_MISSING]
    assert "16 of its 32 rows" in result.reasons[0].message


def test_a_labeling_jobs_photo_turned_by_exif_is_rejected(bucket: Bucket) -> None:
    bucket.put_pair("a", oriented_jpeg(3), encode(color_mask({ROAD: 10}), "PNG"))

    [result] = validate(bucket, line("a"))

    assert codes(result) == [ReasonCode.IMAGE_EXIF_ROTATED]
    assert result.reasons[0].key == f"s3://{BUCKET}/raw/a.jpg"
