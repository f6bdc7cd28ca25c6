"""Names: which keys are safe as both local paths and S3 keys, and what a key in a batch is.

A batch's keys are relative to `incoming/<batch>/`: `images/<stem>.<ext>`, `labels/<stem>.png`
and the optional `_COMPLETE` marker. Names with spaces, `+` and letters of any script are
fine; what could escape a folder, hide a character or break a tool is not.
"""

from __future__ import annotations

import unicodedata
from enum import StrEnum
from typing import NamedTuple

from functions.common.prefixes import (
    COMPLETE_MARKER,
    IMAGES_DIR,
    LABELS_DIR,
    MAX_INCOMING_KEY_BYTES,
    S3_MAX_KEY_BYTES,
    batch_of,
)
from functions.validation.config import ValidationConfig
from functions.validation.reasons import ReasonCode, RejectedError

MAX_SEGMENT_BYTES = 255  # a file name on every common file system
_SHOWN_KEY_CHARS = 120

# Control characters, invisible format characters (bidi overrides that make `gpj.png` read as
# `png.jpg`, zero-width spaces), surrogates, and line/paragraph separators.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


class KeyKind(StrEnum):
    IMAGE = "image"
    LABEL = "label"
    MARKER = "marker"


class BatchKey(NamedTuple):
    key: str
    kind: KeyKind
    stem: str  # NFC-normalised: macOS writes decomposed names, other tools composed ones


def check_key_safety(key: str, max_bytes: int = 1024) -> None:
    """Raise `RejectedError(unsafe_name)` unless `key` is safe as a relative path and S3 key."""
    problem = _key_problem(key, max_bytes)
    if problem is not None:
        raise RejectedError(ReasonCode.UNSAFE_NAME, f"{_shown(key)}: {problem}")


def check_batch_safety(batch: str) -> None:
    """Raise `RejectedError(unsafe_name)` unless the batch folder is safe as one path segment,
    by the very rules a file name is held to: it becomes part of curated, quarantine and report
    keys, and of local paths when they are synced."""
    problem = _key_problem(batch, S3_MAX_KEY_BYTES)  # the segment rule bounds it to 255 bytes
    if problem is not None:
        raise RejectedError(ReasonCode.UNSAFE_NAME, f"the batch folder {_shown(batch)} {problem}")


def check_landing_key(key: str) -> None:
    """Raise `RejectedError(unsafe_name)` for a landing key `incoming/<batch>/...` whose batch
    folder is unsafe, or that is longer than `MAX_INCOMING_KEY_BYTES`: some key derived from it
    (its quarantine copy, its ledger item) would not fit. Its path within the batch is checked
    by `classify_key`."""
    batch = batch_of(key)
    if batch is not None:
        check_batch_safety(batch)
    size = len(key.encode("utf-8", "surrogatepass"))
    if size > MAX_INCOMING_KEY_BYTES:
        raise RejectedError(
            ReasonCode.UNSAFE_NAME,
            f"{_shown(key)}: the key has {size} bytes in UTF-8, more than the limit of {MAX_INCOMING_KEY_BYTES} "
            "(the keys the intake derives from it must fit S3's and DynamoDB's limits)",
        )


def _shown(key: str) -> str:
    return repr(key) if len(key) <= _SHOWN_KEY_CHARS else f"{key[:_SHOWN_KEY_CHARS]!r}..."


def _key_problem(key: str, max_bytes: int) -> str | None:
    if not key:
        return "the name is empty"
    return _encoding_problem(key, max_bytes) or _character_problem(key) or _segment_problem(key)


def _encoding_problem(key: str, max_bytes: int) -> str | None:
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        return "the name is not valid UTF-8"
    if size > max_bytes:
        return f"the key has {size} bytes in UTF-8, more than {max_bytes}"
    return None


def _character_problem(key: str) -> str | None:
    for char in key:
        if unicodedata.category(char) in _UNSAFE_CATEGORIES:
            return f"contains the invisible or control character U+{ord(char):04X}"
    if "\\" in key:
        return "contains a backslash (a path separator on Windows)"
    if key.startswith("/") or _has_drive(key):
        return "is an absolute path"
    return None


def _has_drive(key: str) -> bool:
    # `C:name` is relative to drive C's current folder on Windows.
    return len(key) > 1 and key[1] == ":" and key[0].isascii() and key[0].isalpha()


def _segment_problem(key: str) -> str | None:
    for segment in key.split("/"):
        if not segment:
            return "has an empty path segment (a doubled or trailing /)"
        if segment in {".", ".."}:
            return f"has a {segment!r} path segment"
        if len(segment.encode("utf-8")) > MAX_SEGMENT_BYTES:
            return f"has a path segment longer than {MAX_SEGMENT_BYTES} bytes"
    return None


def split_name(name: str) -> tuple[str, str]:
    """`a.b.JPG` -> (`a.b`, `.jpg`); a name without a dot, or only a leading one, has no
    extension."""
    stem, dot, extension = name.rpartition(".")
    if not dot or not stem:
        return name, ""
    return stem, f".{extension.lower()}"


def check_extension(key: str, allowed: frozenset[str]) -> str:
    """The lower-cased extension of `key`; raise `unsupported_extension` unless allowed."""
    _, extension = split_name(key.rpartition("/")[2])
    if extension not in allowed:
        shown = extension or "no extension"
        raise RejectedError(
            ReasonCode.UNSUPPORTED_EXTENSION,
            f"{shown} is not accepted here; use one of {', '.join(sorted(allowed))}",
        )
    return extension


def classify_key(key: str, config: ValidationConfig) -> BatchKey:
    """What a key relative to its batch is; raise `RejectedError` for anything else."""
    check_key_safety(key, config.max_key_bytes)
    if key == COMPLETE_MARKER:
        return BatchKey(key, KeyKind.MARKER, "")
    folder, _, name = key.partition("/")
    if folder == IMAGES_DIR and "/" not in name:
        check_extension(key, config.image_extensions)
        return BatchKey(key, KeyKind.IMAGE, _stem(name))
    if folder == LABELS_DIR and "/" not in name:
        check_extension(key, config.label_extensions)
        return BatchKey(key, KeyKind.LABEL, _stem(name))
    raise RejectedError(
        ReasonCode.UNEXPECTED_FILE,
        f"{key!r} is neither images/<stem>.<jpg|jpeg|png> nor labels/<stem>.png (nor the {COMPLETE_MARKER} marker)",
    )


def _stem(name: str) -> str:
    return unicodedata.normalize("NFC", split_name(name)[0])
