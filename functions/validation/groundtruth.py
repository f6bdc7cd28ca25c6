"""SageMaker Ground Truth semantic-segmentation output manifests.

Each line of an output manifest is a JSON object: `source-ref` (the image), `<job>-ref` (a
color-coded PNG mask) and `<job>-ref-metadata`, whose `internal-color-map` maps colors to class
names. Colors are resolved through the map, names through the configured class map
(`ValidationConfig.groundtruth_class_map`) to taxonomy ids, and the result is judged like a
Cityscapes pair. Masks are read by color, never by palette index: Ground Truth has written
palette indices that disagree with its own color map.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from PIL import Image

from functions.validation.config import DEFAULT_CONFIG, ValidationConfig
from functions.validation.decoding import Source, decode
from functions.validation.duplicates import ContentIndex
from functions.validation.files import FileFacts, open_checked
from functions.validation.images import check_image
from functions.validation.masks import byte_histogram, check_class_values
from functions.validation.names import check_key_safety
from functions.validation.pairs import Side, judge_pair, missing
from functions.validation.reasons import ReasonCode, RejectedError
from functions.validation.results import FileCheck, PairResult, Reason, Role, Status
from functions.validation.sources import ObjectMissingError, S3Location, SourceReader

SEMANTIC_SEGMENTATION = "groundtruth/semantic-segmentation"
GROUNDTRUTH_MASK_MODES = ("P", "RGB", "RGBA", "L")
MAX_MASK_COLORS = 1024  # far above any label set; a photo or an anti-aliased drawing has more
_SHOWN = 5
_HEX_COLOR = re.compile(r"#[0-9a-fA-F]{6}")

RGB = tuple[int, int, int]


class GroundTruthEntry(NamedTuple):
    """One manifest line that names an image, a mask and the mask's colors."""

    item: str
    source: str  # the URIs as written, for reports
    label: str
    colors: dict[RGB, str]  # color -> Ground Truth class name


def parse_entry(text: str, item: str) -> GroundTruthEntry:
    """A manifest line -> entry; raise `manifest_entry_invalid` for anything else."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _invalid(f"is not JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(record, dict):
        raise _invalid(f"is a JSON {type(record).__name__}, not an object")
    source = record.get("source-ref")
    if not isinstance(source, str):
        raise _invalid("has no string 'source-ref'")
    attribute = _label_attribute(record)
    label = record.get(attribute)
    if not isinstance(label, str):
        raise _invalid(f"has no string {attribute!r}")
    colors = _color_map(record[f"{attribute}-metadata"].get("internal-color-map"))
    return GroundTruthEntry(item=item, source=source, label=label, colors=colors)


def _invalid(problem: str) -> RejectedError:
    return RejectedError(ReasonCode.MANIFEST_ENTRY_INVALID, f"the manifest line {problem}")


def _label_attribute(record: dict[str, Any]) -> str:
    """The `<job>-ref` whose metadata says semantic segmentation (a manifest may carry the
    outputs of several chained jobs)."""
    found = [
        key.removesuffix("-metadata")
        for key, value in record.items()
        if key.endswith("-ref-metadata") and isinstance(value, dict) and value.get("type") == SEMANTIC_SEGMENTATION
    ]
    failures = [v["failure-reason"] for v in record.values() if isinstance(v, dict) and "failure-reason" in v]
    if failures and not found:
        raise _invalid(f"is a failed labeling task: {failures[0]}")
    if len(found) != 1:
        what = "no" if not found else f"{len(found)} ({', '.join(sorted(found))})"
        raise _invalid(f"carries {what} semantic-segmentation label attributes")
    return found[0]


def _color_map(raw: object) -> dict[RGB, str]:
    if not isinstance(raw, dict) or not raw:
        raise _invalid("has no internal-color-map")
    colors: dict[RGB, str] = {}
    for entry in raw.values():
        name, color = _color_entry(entry)
        if colors.setdefault(color, name) != name:
            raise _invalid(f"gives {_hex(color)} to two classes: {colors[color]!r}, {name!r}")
    return colors


def _color_entry(entry: object) -> tuple[str, RGB]:
    if not isinstance(entry, dict):
        raise _invalid("has a color-map entry that is not an object")
    name, hex_color = entry.get("class-name"), entry.get("hex-color")
    if not isinstance(name, str) or not isinstance(hex_color, str):
        raise _invalid(f"has a color-map entry without class-name or hex-color: {entry}")
    if not _HEX_COLOR.fullmatch(hex_color):
        raise _invalid(f"has the color {hex_color!r}, not #rrggbb")
    value = int(hex_color[1:], 16)
    return name, (value >> 16, (value >> 8) & 0xFF, value & 0xFF)


def _hex(color: RGB) -> str:
    return "#{:02x}{:02x}{:02x}".format(*color)


def resolve_location(uri: str, config: ValidationConfig) -> S3Location:
    """Parse `uri` and raise unless it is a safe key inside an allowed location."""
    location = S3Location.parse(uri)
    if not any(_within(location, allowed) for allowed in config.allowed_sources):
        allowed = ", ".join(config.allowed_sources) or "none configured"
        raise RejectedError(ReasonCode.SOURCE_NOT_ALLOWED, f"{uri} is outside the allowed locations ({allowed})")
    check_key_safety(location.key, config.max_key_bytes)
    return location


def _within(location: S3Location, allowed: str) -> bool:
    bucket, _, prefix = allowed.removeprefix("s3://").partition("/")
    # `s3://b/images` allows `s3://b/images/...`, not `s3://b/images-private/...`.
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return location.bucket == bucket and location.key.startswith(prefix)


def check_groundtruth_label(
    source: Source, key: str, colors: Mapping[RGB, str], config: ValidationConfig = DEFAULT_CONFIG
) -> FileCheck:
    """Check a Ground Truth color mask and count its pixels per taxonomy id."""
    facts = FileFacts(key=key, role=Role.LABEL)
    try:
        opened = open_checked(source, facts, config.label_extensions, config)
        check_groundtruth_mode(opened.image.mode)
        decode(opened.image, opened.data, opened.format)
        facts.value_pixels = class_counts(color_counts(opened.image), colors, config)
        check_class_values(facts.value_pixels, config.taxonomy)
    except RejectedError as error:
        return facts.to_check(error)
    return facts.to_check()


def check_groundtruth_mode(mode: str) -> None:
    if mode not in GROUNDTRUTH_MASK_MODES:
        raise RejectedError(
            ReasonCode.IMAGE_MODE_UNSUPPORTED,
            f"the Ground Truth mask has mode {mode}; expected an 8-bit RGB, RGBA or palette PNG",
        )


def color_counts(mask: Image.Image) -> Counter[RGB]:
    """Pixels per RGB color, from C-speed histograms (palette, gray) or `getcolors`."""
    counts: Counter[RGB] = Counter()
    if mask.mode in {"P", "L"}:
        palette = mask.getpalette("RGB") if mask.mode == "P" else None
        for value, count in enumerate(byte_histogram(mask)):
            if count:
                counts[_palette_color(palette, value, count)] += count
        return counts
    found = mask.getcolors(MAX_MASK_COLORS)
    if found is None:
        raise RejectedError(
            ReasonCode.MASK_UNKNOWN_COLOR,
            f"the mask has more than {MAX_MASK_COLORS} distinct colors: a photo or an "
            "anti-aliased drawing, not a label mask",
        )
    for count, color in found:
        assert isinstance(color, tuple)
        counts[(color[0], color[1], color[2])] += count  # alpha is not part of a class color
    return counts


def _palette_color(palette: list[int] | None, value: int, count: int) -> RGB:
    if palette is None:
        return (value, value, value)
    if 3 * value + 2 >= len(palette):
        raise RejectedError(
            ReasonCode.MASK_UNKNOWN_COLOR,
            f"palette index {value} ({count} px) has no color in the mask's palette",
        )
    return (palette[3 * value], palette[3 * value + 1], palette[3 * value + 2])


def class_counts(colors_found: Counter[RGB], color_map: Mapping[RGB, str], config: ValidationConfig) -> dict[int, int]:
    """Pixels per taxonomy id; raise for colors outside the map or classes outside the
    configured mapping."""
    unknown = Counter({_hex(c): n for c, n in colors_found.items() if c not in color_map})
    if unknown:
        raise RejectedError(
            ReasonCode.MASK_UNKNOWN_COLOR,
            f"colors {_most_common(unknown)} are not in the manifest's color map",
        )
    ids: Counter[int] = Counter()
    unmapped: Counter[str] = Counter()  # by repr(name): names may hold spaces
    for color, count in colors_found.items():
        class_id = config.groundtruth_class_id(color_map[color])
        if class_id is None:
            unmapped[repr(color_map[color])] += count
        else:
            ids[class_id] += count
    if unmapped:
        raise RejectedError(
            ReasonCode.CLASS_NOT_MAPPED,
            f"Ground Truth classes {_most_common(unmapped)} map to no taxonomy class; add "
            "them to groundtruth_class_map (a taxonomy class name, or null to ignore)",
        )
    return dict(sorted(ids.items()))


def _most_common(counts: Counter[str]) -> str:
    shown = ", ".join(f"{value} ({count} px)" for value, count in counts.most_common(_SHOWN))
    more = f" and {len(counts) - _SHOWN} more" if len(counts) > _SHOWN else ""
    return shown + more


def validate_entry(
    entry: GroundTruthEntry,
    reader: SourceReader,
    *,
    config: ValidationConfig = DEFAULT_CONFIG,
    index: ContentIndex | None = None,
) -> PairResult:
    """Read and check one manifest entry's image and mask through `reader`."""
    image = _side(entry.source, Role.IMAGE, entry, reader, config)
    label = _side(entry.label, Role.LABEL, entry, reader, config)
    result = judge_pair(entry.item, image, label, taxonomy=config.taxonomy, index=index)
    # Validated, not copied: the URIs as written may hold anything, surrogates included.
    return PairResult.model_validate({**result.model_dump(), "image": entry.source, "label": entry.label})


def _side(uri: str, role: Role, entry: GroundTruthEntry, reader: SourceReader, config: ValidationConfig) -> Side:
    try:
        location = resolve_location(uri, config)
    except RejectedError as error:
        return FileCheck(key=uri, role=role, size_bytes=0, reasons=(Reason.from_error(error, uri),))
    try:
        data = reader.read(location, config.max_file_bytes)
    except ObjectMissingError as exc:
        code = ReasonCode.MISSING_IMAGE if role is Role.IMAGE else ReasonCode.MISSING_LABEL
        return missing(code, f"cannot read {uri}: {exc}", uri)
    if role is Role.IMAGE:
        check = check_image(data, location.key, config)
    else:
        check = check_groundtruth_label(data, location.key, entry.colors, config)
    return _keyed_by_uri(check, uri)


def _keyed_by_uri(check: FileCheck, uri: str) -> FileCheck:
    reasons = [{**reason.model_dump(), "key": uri} for reason in check.reasons]
    return FileCheck.model_validate({**check.model_dump(), "key": uri, "reasons": reasons})


def validate_manifest(
    lines: Iterable[str],
    manifest_name: str,
    reader: SourceReader,
    *,
    config: ValidationConfig = DEFAULT_CONFIG,
    index: ContentIndex | None = None,
) -> Iterator[PairResult]:
    """Every non-blank line of a manifest, as items named `<manifest>:<line number>`."""
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        item = f"{manifest_name}:{number}"
        try:
            entry = parse_entry(text, item)
        except RejectedError as error:
            reason = Reason.from_error(error, None)
            yield PairResult(item=item, image=None, label=None, status=Status.INVALID, reasons=(reason,))
            continue
        yield validate_entry(entry, reader, config=config, index=index)
