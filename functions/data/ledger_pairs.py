"""The ledger's pair, file and content-claim items: every object version's fate, the pair it
belongs to, and which file first brought each content (duplicates are found by it)."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from functions.data.ledger_table import STATE_INDEX, LedgerTable, conditional_failed, iso
from functions.data.models import FileRecord, FileStatus, PairRecord, PairStatus

# DynamoDB's limit on a sort key (a partition key may have 2,048 bytes).
MAX_SORT_KEY_BYTES = 1024
# A file item whose natural sort key would not fit is keyed by a hash of its key and version. No
# landing key starts with `~` (they all start with `incoming/`), so the two forms never meet.
HASHED_FILE_SK = "file#~sha256:"


def file_sort_key(key: str, version: str) -> str:
    """The sort key of one object version's file item: `file#<key>#<version>`, or, where that is
    over DynamoDB's limit (a key refused as too long, a VersionId longer than S3 issues), a hash
    of both. The record itself keeps the key and version whole, so nothing is lost; an over-long
    sort key would fail every write, and its message would end in the dead-letter queue."""
    natural = f"file#{key}#{version}"
    if len(natural.encode("utf-8", "surrogatepass")) <= MAX_SORT_KEY_BYTES:
        return natural
    digest = hashlib.sha256(f"{key}\0{version}".encode("utf-8", "surrogatepass")).hexdigest()
    return f"{HASHED_FILE_SK}{digest}"


class PairItems(LedgerTable):
    # -------------------------------------------------------------- files --
    def put_file(self, record: FileRecord) -> None:
        """One item per object version: a redelivered event rewrites it, never adds one.

        A version once superseded stays so (`ConcurrentUpdateError` for any other fate): a newer
        upload of its key replaced it in its pair. A judgement of the pair that began before the
        newer upload was seen may still copy the older version and come to record it curated
        after it was marked superseded; its pair write then fails, but its redo may judge the
        pair anew without ever coming back to the older version's record.
        """
        self._put(
            f"batch#{record.batch}",
            file_sort_key(record.key, record.version),
            record,
            extra={"status": {"S": record.status.value}},
            unless_status=None if record.status is FileStatus.SUPERSEDED else FileStatus.SUPERSEDED.value,
        )

    def file(self, batch: str, key: str, version: str) -> FileRecord | None:
        item = self._get(f"batch#{batch}", file_sort_key(key, version))
        return self._record(item, FileRecord) if item else None

    def files(self, batch: str) -> list[FileRecord]:
        return [
            self._record(item, FileRecord)
            for item in self._query(
                KeyConditionExpression="pk = :pk AND begins_with(sk, :files)",
                ExpressionAttributeValues={
                    ":pk": {"S": f"batch#{batch}"},
                    ":files": {"S": "file#"},
                },
            )
        ]

    # -------------------------------------------------------------- pairs --
    def pair(self, batch: str, stem: str) -> tuple[PairRecord, int] | None:
        item = self._get(f"batch#{batch}", f"pair#{stem}")
        return (self._record(item, PairRecord), self._revision(item)) if item else None

    def put_pair(self, record: PairRecord, revision: int) -> None:
        state: tuple[str, str] | None = None
        if record.status is PairStatus.PENDING:
            state = ("pair-pending", iso(record.first_seen))
        elif record.status is PairStatus.VALID:
            state = ("pair-valid", f"{record.batch}#{record.stem}")
        self._put(
            f"batch#{record.batch}",
            f"pair#{record.stem}",
            record,
            revision=revision,
            state=state,
            extra={"status": {"S": record.status.value}},
        )

    def pairs(self, batch: str) -> list[PairRecord]:
        return [
            self._record(item, PairRecord)
            for item in self._query(
                KeyConditionExpression="pk = :pk AND begins_with(sk, :pairs)",
                ExpressionAttributeValues={
                    ":pk": {"S": f"batch#{batch}"},
                    ":pairs": {"S": "pair#"},
                },
            )
        ]

    def _pairs_in_state(self, state: str, below: str | None = None) -> list[PairRecord]:
        condition = "state_pk = :state" + (" AND state_sk < :below" if below else "")
        values: dict[str, Any] = {":state": {"S": state}}
        if below:
            values[":below"] = {"S": below}
        return [
            self._record(item, PairRecord)
            for item in self._query(
                IndexName=STATE_INDEX,
                KeyConditionExpression=condition,
                ExpressionAttributeValues=values,
            )
        ]

    def pending_pairs_seen_before(self, cutoff: datetime) -> list[PairRecord]:
        return self._pairs_in_state("pair-pending", below=iso(cutoff))

    def valid_pairs(self) -> list[PairRecord]:
        """Every curated pair: what a dataset version is made of."""
        return self._pairs_in_state("pair-valid")

    # ------------------------------------------------------ content index --
    def claim(self, sha256: str, key: str) -> str | None:
        """The `ContentIndex` protocol: the first key with these bytes, or None if it is `key`."""
        try:
            self._db.put_item(
                TableName=self._table,
                Item={"pk": {"S": f"content#{sha256}"}, "sk": {"S": "content"}, "key": {"S": key}},
                ConditionExpression="attribute_not_exists(pk) OR #key = :key",
                ExpressionAttributeNames={"#key": "key"},
                ExpressionAttributeValues={":key": {"S": key}},
            )
        except ClientError as error:
            if not conditional_failed(error):
                raise
            original = self._get(f"content#{sha256}", "content")
            return original["key"]["S"] if original else None
        return None

    def claims(self) -> list[tuple[str, str]]:
        """Every content claim as `(sha256, key)`. A claim is found by its hash only, so finding
        the ones that name a key takes a scan of the table: for erasures and audits, which are
        rare, never for the intake."""
        found: list[tuple[str, str]] = []
        pages = self._db.get_paginator("scan").paginate(
            TableName=self._table,
            FilterExpression="begins_with(pk, :content)",
            ProjectionExpression="pk, #key",
            ExpressionAttributeNames={"#key": "key"},
            ExpressionAttributeValues={":content": {"S": "content#"}},
            ConsistentRead=True,
        )
        for page in pages:
            found += [(item["pk"]["S"].removeprefix("content#"), item["key"]["S"]) for item in page["Items"]]
        return sorted(found)

    # ------------------------------------------------------------ erasure --
    def erase(
        self,
        batch: str,
        *,
        stem: str | None,
        files: list[FileRecord],
        claims: list[tuple[str, str]],
        dry_run: bool = False,
    ) -> list[str]:
        """Delete a pair's item, its files' items and the content claims `(sha256, key)` that
        still name one of them (an erasure request); the items deleted (with `dry_run`: found),
        as `pk sk`. A claim that names another key belongs to another file and stays."""
        keys = [(f"batch#{batch}", f"pair#{stem}")] if stem is not None else []
        keys += [(f"batch#{f.batch}", file_sort_key(f.key, f.version)) for f in files]
        erased = []
        for pk, sk in keys:
            if dry_run:
                found = self._get(pk, sk) is not None
            else:
                key = {"pk": {"S": pk}, "sk": {"S": sk}}
                old = self._db.delete_item(TableName=self._table, Key=key, ReturnValues="ALL_OLD")
                found = bool(old.get("Attributes"))
            if found:
                erased.append(f"{pk} {sk}")
        for sha256, claimed in claims:
            pk = f"content#{sha256}"
            if dry_run:
                item = self._get(pk, "content")
                found = item is not None and item["key"]["S"] == claimed
            else:
                found = self._delete_claim(pk, claimed)
            if found:
                erased.append(f"{pk} content")
        return erased

    def _delete_claim(self, pk: str, claimed: str) -> bool:
        try:
            self._db.delete_item(
                TableName=self._table,
                Key={"pk": {"S": pk}, "sk": {"S": "content"}},
                ConditionExpression="#key = :key",
                ExpressionAttributeNames={"#key": "key"},
                ExpressionAttributeValues={":key": {"S": claimed}},
            )
        except ClientError as error:
            if conditional_failed(error):
                return False
            raise
        return True
