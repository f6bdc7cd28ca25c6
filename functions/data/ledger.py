"""The ledger in DynamoDB: the only code that knows its item layout (see models.py).

Each record is stored whole as JSON (`record`), beside the few attributes that keys, the sparse
state index and conditional writes need. Pairs and batches carry a revision number: every write
is conditional on the revision read, so two functions racing on one pair cannot both win.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import ClientError
from pydantic import BaseModel

from functions.common.errors import ConcurrentUpdateError
from functions.data.models import (
    BatchRecord,
    FileRecord,
    LockRecord,
    PairRecord,
    PairStatus,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

STATE_INDEX = "state"
# A batch's place in the state index. A closed batch whose curated pairs are all in a dataset
# version is "consumed": it leaves the closed list, so the trigger's reads do not grow with history.
BATCH_OPEN, BATCH_CLOSED, BATCH_CONSUMED = "batch-open", "batch-closed", "batch-consumed"
LOCK_PK = "lock#retrain"
# `retrain data purge` holds the lock while it erases, so that no dataset version is frozen
# meanwhile. Its holder names start with this; ':' is in no Step Functions execution name, so a
# purge's lease is never taken for a run's (whose execution the trigger would look up).
PURGE_HOLDER_PREFIX = "purge:"
RecordT = TypeVar("RecordT", bound=BaseModel)
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


def _iso(moment: datetime) -> str:
    return moment.isoformat()


def _conditional_failed(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


class Ledger:
    def __init__(self, client: DynamoDBClient, table: str) -> None:
        self._db = client
        self._table = table

    # ------------------------------------------------------------ records --
    def _get(self, pk: str, sk: str) -> dict[str, Any] | None:
        item = self._db.get_item(
            TableName=self._table, Key={"pk": {"S": pk}, "sk": {"S": sk}}, ConsistentRead=True
        ).get("Item")
        return dict(item) if item else None

    def _put(
        self,
        pk: str,
        sk: str,
        record: BaseModel,
        *,
        revision: int | None = None,
        state: tuple[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Write a record; with `revision`, only if the stored one still has `revision - 1`."""
        item: dict[str, Any] = {
            "pk": {"S": pk},
            "sk": {"S": sk},
            "record": {"S": record.model_dump_json()},
            **(extra or {}),
        }
        if state is not None:
            item["state_pk"], item["state_sk"] = {"S": state[0]}, {"S": state[1]}
        request: dict[str, Any] = {"TableName": self._table, "Item": item}
        if revision is not None:
            item["revision"] = {"N": str(revision)}
            if revision == 1:
                request["ConditionExpression"] = "attribute_not_exists(pk)"
            else:
                request["ConditionExpression"] = "revision = :previous"
                request["ExpressionAttributeValues"] = {":previous": {"N": str(revision - 1)}}
        try:
            self._db.put_item(**request)
        except ClientError as error:
            if _conditional_failed(error):
                raise ConcurrentUpdateError(f"{pk} {sk} changed while we worked on it") from error
            raise

    def _query(self, **request: Any) -> Iterator[dict[str, Any]]:
        paginator = self._db.get_paginator("query")
        for page in paginator.paginate(TableName=self._table, **request):
            yield from page["Items"]

    @staticmethod
    def _record(item: dict[str, Any], model: type[RecordT]) -> RecordT:
        return model.model_validate_json(item["record"]["S"])

    @staticmethod
    def _revision(item: dict[str, Any] | None) -> int:
        return int(item["revision"]["N"]) if item and "revision" in item else 0

    # ------------------------------------------------------------ batches --
    # `last_seen` lives in its own attribute: every object of a drop touches it, from many
    # functions at once, so it is set unconditionally; the rest changes rarely and by revision.
    def batch(self, batch: str) -> tuple[BatchRecord, int] | None:
        item = self._get(f"batch#{batch}", "batch")
        if item is None:
            return None
        record = self._record(item, BatchRecord)
        last_seen = datetime.fromisoformat(item["last_seen"]["S"])
        return record.model_copy(update={"last_seen": last_seen}), self._revision(item)

    def touch_batch(self, batch: str, now: datetime) -> None:
        """Note activity in a batch, creating it (open) if it is new; never conflicts.

        A consumed batch is closed again: the late object may be new data for the next run.
        """
        initial = BatchRecord(batch=batch, first_seen=now, last_seen=now)
        updated = self._db.update_item(
            TableName=self._table,
            Key={"pk": {"S": f"batch#{batch}"}, "sk": {"S": "batch"}},
            UpdateExpression=(
                "SET last_seen = :now, #record = if_not_exists(#record, :initial), "
                "state_pk = if_not_exists(state_pk, :open), "
                "state_sk = if_not_exists(state_sk, :now), revision = if_not_exists(revision, :one)"
            ),
            ExpressionAttributeNames={"#record": "record"},
            ExpressionAttributeValues={
                ":now": {"S": _iso(now)},
                ":initial": {"S": initial.model_dump_json()},
                ":open": {"S": BATCH_OPEN},
                ":one": {"N": "1"},
            },
            ReturnValues="ALL_NEW",  # UPDATED_NEW may leave out a state_pk that if_not_exists kept
        ).get("Attributes", {})
        if updated.get("state_pk", {}).get("S") == BATCH_CONSUMED:
            self._unconsume_batch(batch)

    def _unconsume_batch(self, batch: str) -> None:
        # Conditional on the state alone, not on a revision read earlier: whoever comes late must
        # still bring the batch back, and a batch already back needs nothing (the check fails).
        try:
            self._db.update_item(
                TableName=self._table,
                Key={"pk": {"S": f"batch#{batch}"}, "sk": {"S": "batch"}},
                UpdateExpression="SET state_pk = :closed, revision = revision + :one",
                ConditionExpression="state_pk = :consumed",
                ExpressionAttributeValues={
                    ":closed": {"S": BATCH_CLOSED},
                    ":consumed": {"S": BATCH_CONSUMED},
                    ":one": {"N": "1"},
                },
            )
        except ClientError as error:
            if not _conditional_failed(error):
                raise

    def close_batch(self, record: BatchRecord, revision: int) -> None:
        """Mark a batch closed, if nobody closed it since we read revision `revision`."""
        closed_at = record.closed_at or record.last_seen
        try:
            self._db.update_item(
                TableName=self._table,
                Key={"pk": {"S": f"batch#{record.batch}"}, "sk": {"S": "batch"}},
                UpdateExpression=("SET #record = :record, state_pk = :closed, state_sk = :at, revision = :next"),
                ConditionExpression="revision = :previous",
                ExpressionAttributeNames={"#record": "record"},
                ExpressionAttributeValues={
                    ":record": {"S": record.model_dump_json()},
                    ":closed": {"S": BATCH_CLOSED},
                    ":at": {"S": _iso(closed_at)},
                    ":next": {"N": str(revision + 1)},
                    ":previous": {"N": str(revision)},
                },
            )
        except ClientError as error:
            if _conditional_failed(error):
                raise ConcurrentUpdateError(f"batch {record.batch} changed meanwhile") from error
            raise

    def open_batches_quiet_since(self, cutoff: datetime) -> list[BatchRecord]:
        """Open batches with no activity since `cutoff` (open batches are few: filter here)."""
        found = []
        for item in self._query(
            IndexName=STATE_INDEX,
            KeyConditionExpression="state_pk = :state",
            ExpressionAttributeValues={":state": {"S": BATCH_OPEN}},
        ):
            last_seen = datetime.fromisoformat(item["last_seen"]["S"])
            if last_seen < cutoff:
                record = self._record(item, BatchRecord)
                found.append(record.model_copy(update={"last_seen": last_seen}))
        return found

    def closed_batches(self) -> list[tuple[BatchRecord, int]]:
        """Closed batches not yet consumed, with their revisions: what the trigger looks at."""
        return [
            (
                self._record(item, BatchRecord).model_copy(
                    update={"last_seen": datetime.fromisoformat(item["last_seen"]["S"])}
                ),
                self._revision(item),
            )
            for item in self._query(
                IndexName=STATE_INDEX,
                KeyConditionExpression="state_pk = :state",
                ExpressionAttributeValues={":state": {"S": BATCH_CLOSED}},
            )
        ]

    def consume_batch(self, record: BatchRecord, revision: int) -> bool:
        """Take a closed batch out of the closed list, once every curated pair it held when read
        (at `revision`, last seen at `record.last_seen`) is in a dataset version. False if it
        changed meanwhile: an object that came since moved `last_seen`, and may be new data."""
        try:
            self._db.update_item(
                TableName=self._table,
                Key={"pk": {"S": f"batch#{record.batch}"}, "sk": {"S": "batch"}},
                UpdateExpression="SET state_pk = :consumed, revision = :next",
                ConditionExpression="state_pk = :closed AND revision = :previous AND last_seen = :seen",
                ExpressionAttributeValues={
                    ":consumed": {"S": BATCH_CONSUMED},
                    ":closed": {"S": BATCH_CLOSED},
                    ":next": {"N": str(revision + 1)},
                    ":previous": {"N": str(revision)},
                    ":seen": {"S": _iso(record.last_seen)},
                },
            )
        except ClientError as error:
            if _conditional_failed(error):
                return False
            raise
        return True

    # -------------------------------------------------------------- files --
    def put_file(self, record: FileRecord) -> None:
        # One item per object version: a redelivered event rewrites it, never adds one.
        self._put(
            f"batch#{record.batch}",
            file_sort_key(record.key, record.version),
            record,
            extra={"status": {"S": record.status.value}},
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
            state = ("pair-pending", _iso(record.first_seen))
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
        return self._pairs_in_state("pair-pending", below=_iso(cutoff))

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
            if not _conditional_failed(error):
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

    # --------------------------------------------------------------- lock --
    @staticmethod
    def is_purge_holder(holder: str) -> bool:
        return holder.startswith(PURGE_HOLDER_PREFIX)

    def lock(self) -> LockRecord | None:
        item = self._get(LOCK_PK, "lock")
        return self._record(item, LockRecord) if item else None

    def acquire_lock(self, record: LockRecord, *, replacing: LockRecord | None) -> bool:
        """Take the lock if it is free, or if it is still exactly the stale one we looked at."""
        request: dict[str, Any] = {
            "TableName": self._table,
            "Item": {
                "pk": {"S": LOCK_PK},
                "sk": {"S": "lock"},
                "holder": {"S": record.holder},
                "record": {"S": record.model_dump_json()},
            },
            "ConditionExpression": "attribute_not_exists(pk)",
        }
        if replacing is not None:
            request["ConditionExpression"] = "holder = :stale"
            request["ExpressionAttributeValues"] = {":stale": {"S": replacing.holder}}
        try:
            self._db.put_item(**request)
        except ClientError as error:
            if _conditional_failed(error):
                return False
            raise
        return True

    def release_lock(self, holder: str) -> bool:
        try:
            self._db.delete_item(
                TableName=self._table,
                Key={"pk": {"S": LOCK_PK}, "sk": {"S": "lock"}},
                ConditionExpression="holder = :holder",
                ExpressionAttributeValues={":holder": {"S": holder}},
            )
        except ClientError as error:
            if _conditional_failed(error):
                return False
            raise
        return True

    # ---------------------------------------------- overview and erasure --
    def batches(self) -> list[BatchRecord]:
        """Every batch, open, closed and consumed (`retrain data status`)."""
        return [
            self._record(item, BatchRecord).model_copy(
                update={"last_seen": datetime.fromisoformat(item["last_seen"]["S"])}
            )
            for state in (BATCH_OPEN, BATCH_CLOSED, BATCH_CONSUMED)
            for item in self._query(
                IndexName=STATE_INDEX,
                KeyConditionExpression="state_pk = :state",
                ExpressionAttributeValues={":state": {"S": state}},
            )
        ]

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
            if _conditional_failed(error):
                return False
            raise
        return True
