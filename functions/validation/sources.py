"""Where file bytes come from: small reader protocols, and their local-folder implementations.

The checks only ever see bytes; readers are the adapters. The intake Lambda implements the
protocols with S3 `get_object` (reading at most `limit` + 1 bytes of the body); the CLI uses the
local readers below.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple, Protocol
from urllib.parse import urlsplit

from functions.common.errors import RetrainError
from functions.validation.reasons import ReasonCode, RejectedError

# S3's bucket naming rules: 3-63 lower-case letters, digits, dots and hyphens.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")


class ObjectMissingError(RetrainError):
    """The object or file does not exist (yet), or cannot be read."""


class S3Location(NamedTuple):
    bucket: str
    key: str

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @classmethod
    def parse(cls, uri: str) -> S3Location:
        """`s3://bucket/key` -> S3Location; anything else is not an allowed source."""
        parts = urlsplit(uri)
        key = uri[len(f"s3://{parts.netloc}/") :]
        well_formed = parts.scheme == "s3" and _BUCKET.fullmatch(parts.netloc) is not None
        if not well_formed or not key or parts.query or parts.fragment:
            raise RejectedError(ReasonCode.SOURCE_NOT_ALLOWED, f"{uri!r} is not an s3://bucket/key location")
        return cls(parts.netloc, key)


class BatchReader(Protocol):
    def read(self, key: str, limit: int) -> bytes:
        """At most `limit` + 1 bytes of the file at `key` (relative to the batch); raises
        `ObjectMissingError`."""
        ...


class SourceReader(Protocol):
    def read(self, location: S3Location, limit: int) -> bytes:
        """At most `limit` + 1 bytes of the object at `location`; raises `ObjectMissingError`."""
        ...


def _read_inside(root: Path, relative: str, limit: int) -> bytes:
    path = root / relative
    # Names are checked before anything is read; this is the second lock on the same door.
    if not path.resolve().is_relative_to(root.resolve()):
        raise ObjectMissingError(f"{relative!r} resolves outside {root}")
    try:
        with path.open("rb") as file:
            return file.read(limit + 1)
    except OSError as exc:
        raise ObjectMissingError(f"{relative}: {exc.strerror or exc}") from exc


class LocalBatchReader:
    """A batch as a local folder: `DIR/images/<stem>.jpg`, `DIR/labels/<stem>.png`, ..."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def keys(self) -> list[str]:
        """Every file under the folder as a batch-relative key with `/` separators."""
        found: list[str] = []
        for folder, _, files in os.walk(self.root):
            relative = Path(folder).relative_to(self.root)
            found.extend((relative / name).as_posix() for name in files)
        return sorted(found)

    def read(self, key: str, limit: int) -> bytes:
        return _read_inside(self.root, key, limit)


class LocalMirrorReader:
    """S3 as a local mirror: `s3://bucket/key` is the file `ROOT/bucket/key` (what
    `aws s3 sync s3://bucket ROOT/bucket` produces)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, location: S3Location, limit: int) -> bytes:
        return _read_inside(self.root, f"{location.bucket}/{location.key}", limit)
