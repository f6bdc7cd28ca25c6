"""The ledger's trust items: one per batch whose labels are not simply new (`models.Trust`).

Each lives beside its batch (`batch#<batch>`, sort key `trust`) with the trust as an attribute
of its own, so that writes can be conditional on it: screening holds a batch only if no operator
has released it (their decision stands), and an accepted run trusts only batches still new. The
sparse state index lists them all (`trust` partition), which is what the trigger reads when it
freezes a version.
"""

from __future__ import annotations

from typing import Any

from functions.data.ledger_table import STATE_INDEX, LedgerTable
from functions.data.models import Trust, TrustRecord

TRUST_SK = "trust"
TRUST_STATE = "trust"


class TrustItems(LedgerTable):
    def trust(self, batch: str) -> TrustRecord | None:
        item = self._get(f"batch#{batch}", TRUST_SK)
        return self._record(item, TrustRecord) if item is not None else None

    def trusts(self) -> dict[str, TrustRecord]:
        """Every batch that has a trust record, by name (the others are new)."""
        items = self._query(
            IndexName=STATE_INDEX,
            KeyConditionExpression="state_pk = :state",
            ExpressionAttributeValues={":state": {"S": TRUST_STATE}},
        )
        return {record.batch: record for record in (self._record(item, TrustRecord) for item in items)}

    def set_trust(self, record: TrustRecord) -> None:
        """An operator's decision: whatever the batch's trust was, it is this now."""
        self._write(record)

    def hold(self, record: TrustRecord) -> bool:
        """Screening's hold: only a batch no one has released, trusted or named a benchmark
        (a batch held before stays held, with this run's reasons). False if it was not held."""
        return self._write(
            record, condition="attribute_not_exists(pk) OR trust = :held", values={":held": {"S": Trust.HELD}}
        )

    def trust_batches(self, records: list[TrustRecord]) -> list[str]:
        """An accepted run's batches earn trust, if still new (no record): the names that did."""
        return [record.batch for record in records if self._write(record, condition="attribute_not_exists(pk)")]

    def forget_trust(self, batch: str) -> None:
        """The batch is erased (`retrain data purge`): its trust goes with it."""
        self._db.delete_item(TableName=self._table, Key={"pk": {"S": f"batch#{batch}"}, "sk": {"S": TRUST_SK}})

    def _write(
        self, record: TrustRecord, *, condition: str | None = None, values: dict[str, Any] | None = None
    ) -> bool:
        request: dict[str, Any] = {
            "TableName": self._table,
            "Item": {
                "pk": {"S": f"batch#{record.batch}"},
                "sk": {"S": TRUST_SK},
                "record": {"S": record.model_dump_json()},
                "trust": {"S": record.trust.value},
                "state_pk": {"S": TRUST_STATE},
                "state_sk": {"S": record.batch},
            },
        }
        if condition is not None:
            request["ConditionExpression"] = condition
        if values:
            request["ExpressionAttributeValues"] = values
        return self._put_if(request)
