"""A batch as the intake sees it: files pair up by stem, arrive in any order, and each item
ends valid, invalid, incomplete or a duplicate."""

from __future__ import annotations

import unicodedata

from functions.validation import (
    DEFAULT_CONFIG,
    FileCheck,
    InMemoryContentIndex,
    ObjectMissingError,
    PairResult,
    ReasonCode,
    Status,
    check_image,
    check_label,
    judge_pair,
    missing,
    plan_pairs,
    validate_batch,
)

from .corpus import jpeg, mask, palette_mask, png


class FakeBatch:
    """A batch in memory: key -> bytes, read like S3 would be."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    def read(self, key: str, limit: int) -> bytes:
        if key not in self.files:
            raise ObjectMissingError(f"{key} is gone")
        return self.files[key][: limit + 1]


def run(files: dict[str, bytes]) -> dict[str, PairResult]:
    results = validate_batch(files, FakeBatch(files), index=InMemoryContentIndex())
    return {result.item: result for result in results}


def codes(result: PairResult) -> list[ReasonCode]:
    return [reason.code for reason in result.reasons]


def test_an_annotators_batch_of_good_pairs_in_every_variant_is_valid() -> None:
    files = {
        "images/rue de la paix.jpg": jpeg(),
        "labels/rue de la paix.png": mask(),
        "images/a+b.png": png(mode="L"),
        "labels/a+b.png": palette_mask(),
        "images/東京.jpeg": jpeg(mode="L", size=(64, 33)),
        "labels/東京.png": mask(size=(64, 33)),
        # The image comes from macOS (decomposed é), the label from a Linux tool (composed).
        unicodedata.normalize("NFD", "images/café.jpg"): jpeg(size=(65, 32)),
        unicodedata.normalize("NFC", "labels/café.png"): mask(size=(65, 32)),
        "_COMPLETE": b"",
    }

    results = run(files)

    assert sorted(results) == ["a+b", "café", "rue de la paix", "東京"]
    assert {item: r.status for item, r in results.items()} == dict.fromkeys(results, Status.VALID)


def test_an_image_whose_label_has_not_arrived_is_incomplete() -> None:
    result = run({"images/a.jpg": jpeg()})["a"]

    assert result.status is Status.INCOMPLETE
    assert codes(result) == [ReasonCode.MISSING_LABEL]
    assert "labels/a.png" in result.reasons[0].message


def test_a_label_whose_image_has_not_arrived_is_incomplete() -> None:
    result = run({"labels/a.png": mask()})["a"]

    assert result.status is Status.INCOMPLETE
    assert codes(result) == [ReasonCode.MISSING_IMAGE]


def test_a_lone_broken_image_is_invalid_not_merely_incomplete() -> None:
    result = run({"images/a.jpg": b""})["a"]

    assert result.status is Status.INVALID
    assert codes(result) == [ReasonCode.EMPTY_FILE, ReasonCode.MISSING_LABEL]


def test_an_object_that_vanishes_before_it_is_read_is_missing() -> None:
    planned = plan_pairs(["images/a.jpg", "labels/a.png"])
    reader = FakeBatch({"images/a.jpg": jpeg()})

    result = next(validate_batch(["images/a.jpg", "labels/a.png"], reader))

    assert planned[0].label == "labels/a.png"
    assert result.status is Status.INCOMPLETE
    assert "labels/a.png is gone" in result.reasons[0].message


def test_the_same_photo_uploaded_twice_points_at_the_original() -> None:
    photo = jpeg()

    results = run(
        {
            "images/a.jpg": photo,
            "labels/a.png": mask(),
            "images/b.jpg": photo,
            "labels/b.png": mask(),
        }
    )

    assert results["a"].status is Status.VALID
    assert results["b"].status is Status.DUPLICATE
    assert results["b"].duplicate_of == "images/a.jpg"
    assert codes(results["b"]) == [ReasonCode.DUPLICATE_IMAGE]
    assert f"sha256 {results['b'].image_sha256}" in results["b"].reasons[0].message


def test_a_corrected_resubmission_of_a_rejected_pair_is_not_a_duplicate() -> None:
    photo = jpeg()

    results = run(
        {
            "images/a.jpg": photo,
            "labels/a.png": mask(regions={99: 1}),
            "images/b.jpg": photo,
            "labels/b.png": mask(),
        }
    )

    assert results["a"].status is Status.INVALID
    assert results["b"].status is Status.VALID


def test_a_redelivered_event_does_not_make_a_file_its_own_duplicate() -> None:
    index = InMemoryContentIndex()
    image, label = check_image(jpeg(), "images/a.jpg"), check_label(mask(), "labels/a.png")

    first = judge_pair("a", image, label, taxonomy=DEFAULT_CONFIG.taxonomy, index=index)
    again = judge_pair("a", image, label, taxonomy=DEFAULT_CONFIG.taxonomy, index=index)

    assert (first.status, again.status) == (Status.VALID, Status.VALID)


def test_two_images_with_one_stem_are_ambiguous() -> None:
    results = run({"images/a.jpg": jpeg(), "images/a.png": png(), "labels/a.png": mask()})

    assert {item: codes(r) for item, r in results.items()} == {
        "images/a.jpg": [ReasonCode.AMBIGUOUS_STEM],
        "images/a.png": [ReasonCode.AMBIGUOUS_STEM],
        "labels/a.png": [ReasonCode.AMBIGUOUS_STEM],
    }
    assert "images/a.jpg, images/a.png, labels/a.png" in results["labels/a.png"].reasons[0].message


def test_stray_files_in_a_batch_are_reported_not_dropped() -> None:
    results = run(
        {
            "notes.txt": b"hello",
            "images/sub/a.jpg": jpeg(),
            "labels/b.jpg": jpeg(),
            "images/../x.jpg": jpeg(),
        }
    )

    assert {item: (r.status, codes(r)) for item, r in results.items()} == {
        "notes.txt": (Status.INVALID, [ReasonCode.UNEXPECTED_FILE]),
        "images/sub/a.jpg": (Status.INVALID, [ReasonCode.UNEXPECTED_FILE]),
        "labels/b.jpg": (Status.INVALID, [ReasonCode.UNSUPPORTED_EXTENSION]),
        "images/../x.jpg": (Status.INVALID, [ReasonCode.UNSAFE_NAME]),
    }
    assert results["labels/b.jpg"].label == "labels/b.jpg"


def test_the_intake_judges_a_pair_from_checks_it_kept_in_its_ledger() -> None:
    # The label lands first; its check waits in DynamoDB as JSON until the image arrives.
    stored = check_label(mask(), "incoming/b1/labels/a.png").model_dump_json()
    image = check_image(jpeg(), "incoming/b1/images/a.jpg")

    result = judge_pair(
        "a",
        image,
        FileCheck.model_validate_json(stored),
        taxonomy=DEFAULT_CONFIG.taxonomy,
        index=InMemoryContentIndex(),
    )

    assert result.status is Status.VALID
    assert result.class_pixels == {"road": 52 * 32, "sky": 8 * 32, "car": 4 * 32}


def test_the_intake_reports_a_pair_still_waiting_for_its_image() -> None:
    label = check_label(mask(), "incoming/b1/labels/a.png")

    result = judge_pair(
        "a",
        missing(ReasonCode.MISSING_IMAGE, "no image after the quiet period"),
        label,
        taxonomy=DEFAULT_CONFIG.taxonomy,
    )

    assert result.status is Status.INCOMPLETE
    assert (result.image, result.label) == (None, "incoming/b1/labels/a.png")
