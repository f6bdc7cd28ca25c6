"""The ledger's batch items and the run lock: a batch's life from open to consumed, and the one
lease that lets a single run (or a purge) freeze a dataset version."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from functions.common.errors import ConcurrentUpdateError
from functions.data.ledger_table import STATE_INDEX, LedgerTable, conditional_failed, iso
from functions.data.models import BatchRecord, LockRecord

# A batch's place in the state index. A closed batch whose curated pairs are all in a dataset
# version is "consumed": it leaves the closed list, so the trigger's reads do not grow with history.
BATCH_OPEN, BATCH_CLOSED, BATCH_CONSUMED = "batch-open", "batch-closed", "batch-consumed"
LOCK_PK = "lock#retrain"
# `retrain data purge` holds the lock while it erases, so that no dataset version is frozen
# meanwhile. Its holder names start with this; ':' is in no Step Functions execution name, so a
# purge's lease is never taken for a run's (whose execution the trigger would look up).
PURGE_HOLDER_PREFIX = "purge:"


class BatchItems(LedgerTable):
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
                ":now": {"S": iso(now)},
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
            if not conditional_failed(error):
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
                    ":at": {"S": iso(closed_at)},
                    ":next": {"N": str(revision + 1)},
                    ":previous": {"N": str(revision)},
                },
            )
        except ClientError as error:
            if conditional_failed(error):
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
                    ":seen": {"S": iso(record.last_seen)},
                },
            )
        except ClientError as error:
            if conditional_failed(error):
                return False
            raise
        return True

    # ----------------------------------------------------------- overview --
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
        return self._put_if(request)

    def release_lock(self, holder: str) -> bool:
        try:
            self._db.delete_item(
                TableName=self._table,
                Key={"pk": {"S": LOCK_PK}, "sk": {"S": "lock"}},
                ConditionExpression="holder = :holder",
                ExpressionAttributeValues={":holder": {"S": holder}},
            )
        except ClientError as error:
            if conditional_failed(error):
                return False
            raise
        return True
