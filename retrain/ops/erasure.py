"""An erasure request and its report: what each KEY names, and what a purge erased.

A KEY is `incoming/<batch>/images|labels/<file>`, `dataset/images|labels/<batch>/<file>`,
`quarantine/<batch>/<file>` (or its `.reason.json`), `<batch>/<stem>`, or any of those as
`s3://<bucket>/...`; `<batch>/`, with its slash, is the whole batch (a held one's labels are not
wanted, or an erasure request covers a drop): a bare `<batch>` is refused, so that a slip of the
keyboard (a stem forgotten) cannot erase a whole drop. The work itself is in `purge.py`.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, Field

from functions.common import prefixes
from functions.common.errors import RetrainError
from functions.data.models import ObjectVersion
from functions.validation.names import split_name


class PurgeUsageError(RetrainError, ValueError):
    """A KEY that names no image, label or pair of the data bucket."""


@dataclass(frozen=True)
class Target:
    """What one KEY names: a pair (`stem`) of a batch, a lone landing file (`key`), or, with
    neither, the whole batch."""

    given: str
    batch: str
    stem: str | None
    key: str | None = None

    @property
    def whole_batch(self) -> bool:
        return self.stem is None and self.key is None


def stem_of(name: str) -> str:
    """The pair a file name belongs to, as intake names it (`x.jpg`, `x.png.reason.json`: x)."""
    return unicodedata.normalize("NFC", split_name(name.removesuffix(prefixes.REASON_SUFFIX))[0])


def parse_target(given: str, bucket: str) -> Target:
    """`incoming/<batch>/images/x.jpg`, `dataset/labels/<batch>/x.png`, `quarantine/...`,
    `<batch>/<stem>`, or any of those as `s3://<bucket>/...`."""
    raw = given.strip()
    if raw.startswith("s3://"):
        name, _, raw = raw.removeprefix("s3://").partition("/")
        if name != bucket:
            raise PurgeUsageError(f"{given}: not in the data bucket {bucket}")
    if raw.startswith(prefixes.INCOMING):
        batch = prefixes.batch_of(raw) or prefixes.UNBATCHED
        return _landing_target(given, batch, prefixes.relative_to_batch(raw), raw)
    if raw.startswith(prefixes.QUARANTINE):
        batch, sep, relative = raw.removeprefix(prefixes.QUARANTINE).partition("/")
        relative = relative.removesuffix(prefixes.REASON_SUFFIX)
        if not (batch and sep and relative):
            raise PurgeUsageError(f"{given}: expected quarantine/<batch>/<file>")
        landing = prefixes.landing_key(batch, relative)
        return _landing_target(given, batch, relative, landing)
    if raw.startswith(prefixes.DATASET):
        folder, _, rest = raw.removeprefix(prefixes.DATASET).partition("/")
        batch, _, name = rest.partition("/")
        if folder not in prefixes.PAIR_FOLDERS or not batch or not name or "/" in name:
            raise PurgeUsageError(
                f"{given}: expected dataset/images/<batch>/<file> or dataset/labels/<batch>/<file>"
                " (a manifest is not erased; the pairs in it are)"
            )
        return Target(given, batch, stem_of(name))
    whole = raw.removesuffix("/")
    if raw.endswith("/") and whole and "/" not in whole and whole not in {".", ".."}:
        return Target(given, unicodedata.normalize("NFC", whole), None)  # the whole batch, asked for by name
    if raw and "/" not in raw and raw not in {".", ".."}:
        raise PurgeUsageError(
            f"{given}: to erase the whole batch, name it with its slash, {raw}/ (try --dry-run first); "
            f"one pair is {raw}/<stem>"
        )
    parts = raw.split("/")
    if len(parts) == 2 and all(parts) and not raw.startswith(prefixes.REPORTS):
        return Target(given, parts[0], unicodedata.normalize("NFC", parts[1]))
    raise PurgeUsageError(
        f"{given}: expected incoming/<batch>/images|labels/<file>, "
        "dataset/images|labels/<batch>/<file>, quarantine/<batch>/..., <batch>/<stem> or <batch>/"
    )


def _landing_target(given: str, batch: str, relative: str, key: str) -> Target:
    folder, _, name = relative.partition("/")
    if folder in prefixes.PAIR_FOLDERS and name and "/" not in name:
        return Target(given, batch, stem_of(name), key)
    return Target(given, batch, None, key)  # a stray file: no pair to look for


class ErasedPair(BaseModel):
    batch: str
    stem: str | None  # None: a lone landing file that was no pair's
    key: str | None
    requested_as: str
    why: str  # "requested", or "same image bytes as <batch>/<stem>"
    status: str | None  # the pair's status in the ledger, if it had a record


class ManifestChange(BaseModel):
    manifest: str
    dataset_version: str
    entries_removed: list[str]  # the image paths of the lines taken out
    record: str  # dataset/manifests/<version>.purged.json
    versions_deleted: int  # older versions of the manifest (they still held the lines)


class PurgeReport(BaseModel):
    dry_run: bool
    at: datetime
    requested: list[str]
    unmatched: list[str]  # KEYs that matched nothing (exit 1)
    batches: list[str] = Field(default_factory=list)  # erased whole: their trust records go too
    pairs: list[ErasedPair]
    objects: list[ObjectVersion]
    ledger_items: list[str]
    manifests: list[ManifestChange]
    reports: list[str]  # batch reports rewritten without the erased files
    remaining: list[ObjectVersion]  # found again after erasing and still there: should be empty
    warnings: list[str]
