"""Pairs: an image and its label share a stem; together they are valid, invalid, incomplete
or a duplicate.

The intake Lambda checks each object as it lands (`check_image`, `check_label`), keeps the
`FileCheck` in its ledger, and calls `judge_pair` when the partner is there. The CLI and the
sweeper see whole batches: `plan_pairs` groups keys by stem and `validate_batch` runs it all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from functions.common.prefixes import IMAGES_DIR, LABELS_DIR
from functions.common.taxonomy import Taxonomy
from functions.validation.config import DEFAULT_CONFIG, ValidationConfig
from functions.validation.decoding import Source
from functions.validation.duplicates import ContentIndex
from functions.validation.images import check_image
from functions.validation.masks import check_label, class_pixels
from functions.validation.names import KeyKind, classify_key, split_name
from functions.validation.reasons import ReasonCode, RejectedError
from functions.validation.results import FileCheck, PairResult, Reason, Role, Status
from functions.validation.sources import BatchReader, ObjectMissingError

# A side of a pair: the file's check, or why there is no file (a `missing_*` reason).
Side = FileCheck | Reason
_MISSING = frozenset({ReasonCode.MISSING_IMAGE, ReasonCode.MISSING_LABEL})


def judge_pair(
    item: str,
    image: Side,
    label: Side,
    *,
    taxonomy: Taxonomy,
    index: ContentIndex | None = None,
) -> PairResult:
    """The verdict on a pair from its two sides; claims the image's hash in `index` only when
    everything else is valid, so a corrected resubmission of a rejected pair is not a duplicate."""
    reasons = [*_reasons_of(image), *_reasons_of(label)]
    result = _base_result(item, image, label)
    if not isinstance(image, FileCheck) or not isinstance(label, FileCheck):
        # A lone file that is broken already is invalid; one that is fine is only waiting.
        waiting = all(r.code in _MISSING for r in reasons)
        status = Status.INCOMPLETE if waiting else Status.INVALID
        return result.model_copy(update={"status": status, "reasons": tuple(reasons)})
    reasons.extend(_size_mismatch(image, label))
    if reasons:
        return result.model_copy(update={"status": Status.INVALID, "reasons": tuple(reasons)})
    return _accepted(result, image, label, taxonomy, index)


def missing(code: ReasonCode, message: str, key: str | None = None) -> Reason:
    """The side of a pair whose file is not there: `missing_image` or `missing_label`."""
    return Reason(code=code, message=message, key=key)


def _reasons_of(side: Side) -> tuple[Reason, ...]:
    return side.reasons if isinstance(side, FileCheck) else (side,)


def _size_mismatch(image: FileCheck, label: FileCheck) -> list[Reason]:
    if None in (image.width, image.height, label.width, label.height):
        return []
    # A bomb's declared size is a lie worth no comparison.
    if any(r.code is ReasonCode.DECOMPRESSION_BOMB for r in (*image.reasons, *label.reasons)):
        return []
    if (image.width, image.height) == (label.width, label.height):
        return []
    message = (
        f"the image {image.key} is {image.width}x{image.height} but its mask {label.key} is "
        f"{label.width}x{label.height}"
    )
    return [Reason(code=ReasonCode.MASK_SIZE_MISMATCH, message=message, key=label.key)]


def _base_result(item: str, image: Side, label: Side) -> PairResult:
    image_check = image if isinstance(image, FileCheck) else None
    label_check = label if isinstance(label, FileCheck) else None
    return PairResult(
        item=item,
        image=image_check.key if image_check else image.key,
        label=label_check.key if label_check else label.key,
        status=Status.INVALID,
        image_sha256=image_check.sha256 if image_check else None,
        label_sha256=label_check.sha256 if label_check else None,
        width=image_check.width if image_check else None,
        height=image_check.height if image_check else None,
    )


def _accepted(
    result: PairResult,
    image: FileCheck,
    label: FileCheck,
    taxonomy: Taxonomy,
    index: ContentIndex | None,
) -> PairResult:
    named, ignored = class_pixels(label.value_pixels or {}, taxonomy)
    update: dict[str, object] = {
        "status": Status.VALID,
        "class_pixels": named,
        "ignore_pixels": ignored,
    }
    original = None
    if index is not None and image.sha256 is not None:
        original = index.claim(image.sha256, image.key)
    if original is not None:
        reason = Reason(
            code=ReasonCode.DUPLICATE_IMAGE,
            message=f"same bytes as {original} (sha256 {image.sha256})",
            key=image.key,
        )
        update |= {"status": Status.DUPLICATE, "reasons": (reason,), "duplicate_of": original}
    return result.model_copy(update=update)


def validate_pair(
    image: Source,
    image_key: str,
    label: Source,
    label_key: str,
    *,
    config: ValidationConfig = DEFAULT_CONFIG,
    index: ContentIndex | None = None,
    item: str | None = None,
) -> PairResult:
    """Check an image and its mask from their bytes (or binary file objects)."""
    return judge_pair(
        item or split_name(image_key.rpartition("/")[2])[0],
        check_image(image, image_key, config),
        check_label(label, label_key, config),
        taxonomy=config.taxonomy,
        index=index,
    )


class PlannedItem(NamedTuple):
    """One item of a batch: a stem with at most one image and one label, or a key rejected by
    its name alone."""

    item: str
    image: str | None
    label: str | None
    rejection: Reason | None = None


def plan_pairs(keys: Iterable[str], config: ValidationConfig = DEFAULT_CONFIG) -> list[PlannedItem]:
    """Group a batch's keys (relative to the batch) by stem, sorted by item."""
    groups: dict[str, tuple[list[str], list[str]]] = {}
    planned: list[PlannedItem] = []
    for key in keys:
        try:
            batch_key = classify_key(key, config)
        except RejectedError as error:
            planned.append(_rejected_key(key, Reason.from_error(error, key)))
            continue
        if batch_key.kind is KeyKind.MARKER:
            continue
        images, labels = groups.setdefault(batch_key.stem, ([], []))
        (images if batch_key.kind is KeyKind.IMAGE else labels).append(key)
    for stem, (images, labels) in groups.items():
        planned.extend(_items_of_stem(stem, images, labels))
    return sorted(planned, key=lambda planned_item: planned_item.item)


def _rejected_key(key: str, reason: Reason) -> PlannedItem:
    folder = key.partition("/")[0]
    image = key if folder == IMAGES_DIR else None
    label = key if folder == LABELS_DIR else None
    return PlannedItem(item=key, image=image, label=label, rejection=reason)


def _items_of_stem(stem: str, images: list[str], labels: list[str]) -> list[PlannedItem]:
    if len(images) <= 1 and len(labels) <= 1:
        return [PlannedItem(stem, images[0] if images else None, labels[0] if labels else None)]
    # Which of two same-stem files the annotator meant is a guess we do not make.
    message = f"the stem {stem!r} is shared by {', '.join(sorted(images + labels))}"
    return [
        _rejected_key(key, Reason(code=ReasonCode.AMBIGUOUS_STEM, message=message, key=key))
        for key in sorted(images + labels)
    ]


def validate_planned(
    planned: PlannedItem,
    reader: BatchReader,
    *,
    config: ValidationConfig = DEFAULT_CONFIG,
    index: ContentIndex | None = None,
) -> PairResult:
    if planned.rejection is not None:
        return PairResult(
            item=planned.item,
            image=planned.image,
            label=planned.label,
            status=Status.INVALID,
            reasons=(planned.rejection,),
        )
    image = _read_side(planned, Role.IMAGE, reader, config)
    label = _read_side(planned, Role.LABEL, reader, config)
    return judge_pair(planned.item, image, label, taxonomy=config.taxonomy, index=index)


_CHECKS: dict[Role, tuple[Callable[[Source, str, ValidationConfig], FileCheck], ReasonCode]] = {
    Role.IMAGE: (check_image, ReasonCode.MISSING_IMAGE),
    Role.LABEL: (check_label, ReasonCode.MISSING_LABEL),
}


def _read_side(planned: PlannedItem, role: Role, reader: BatchReader, config: ValidationConfig) -> Side:
    check, code = _CHECKS[role]
    key, partner = (planned.image, planned.label)[:: 1 if role is Role.IMAGE else -1]
    if key is None:
        expected = (
            f"{IMAGES_DIR}/{planned.item}.<jpg|jpeg|png>" if role is Role.IMAGE else f"{LABELS_DIR}/{planned.item}.png"
        )
        return missing(code, f"{partner} has no partner: expected {expected}")
    try:
        data = reader.read(key, config.max_file_bytes)
    except ObjectMissingError as exc:
        return missing(code, f"cannot read {key}: {exc}", key)
    return check(data, key, config)


def validate_batch(
    keys: Iterable[str],
    reader: BatchReader,
    *,
    config: ValidationConfig = DEFAULT_CONFIG,
    index: ContentIndex | None = None,
) -> Iterator[PairResult]:
    """Every item of a batch, one at a time (at most one pair's bytes in memory)."""
    for planned in plan_pairs(keys, config):
        yield validate_planned(planned, reader, config=config, index=index)
