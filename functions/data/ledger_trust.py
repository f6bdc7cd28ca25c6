"""The ledger's trust items: one per batch that has any pair verdict (`models.BatchTrust`).

They live in a partition of their own (`trust#<batch>`, sort key `trust`), never beside the
batch's files and pairs (`batch#<batch>`): IAM tells partitions apart by their leading key, so the
intake, which writes batches, cannot write trust (the template's Deny, tests/unit/test_permissions.py).
Readers check the partition of what they read: the sparse state index lists every trust item
(`trust` partition), and an item anyone wrote elsewhere with that index key is not one of them.

Every write is conditional on the revision read (`update_trust`), so a screening's holds and a
person's release of the same batch cannot overwrite each other.
"""

from __future__ import annotations

from collections.abc import Callable

from functions.common.errors import ConcurrentUpdateError
from functions.data.ledger_table import STATE_INDEX, LedgerTable
from functions.data.models import BatchTrust

TRUST_PK_PREFIX = "trust#"
TRUST_SK = "trust"
TRUST_STATE = "trust"
DECISIONS_KEPT = 20
UPDATE_ATTEMPTS = 5


def trust_pk(batch: str) -> str:
    return f"{TRUST_PK_PREFIX}{batch}"


class TrustItems(LedgerTable):
    def trust(self, batch: str) -> BatchTrust | None:
        item = self._get(trust_pk(batch), TRUST_SK)
        return self._record(item, BatchTrust) if item is not None else None

    def trusts(self) -> dict[str, BatchTrust]:
        """Every batch with pair verdicts, by name (a batch without one has only new pairs)."""
        found: dict[str, BatchTrust] = {}
        items = self._query(
            IndexName=STATE_INDEX,
            KeyConditionExpression="state_pk = :state",
            ExpressionAttributeValues={":state": {"S": TRUST_STATE}},
        )
        for item in items:
            if item.get("sk", {}).get("S") != TRUST_SK or not item["pk"]["S"].startswith(TRUST_PK_PREFIX):
                continue  # not a trust item, whatever its index key says
            record = self._record(item, BatchTrust)
            if trust_pk(record.batch) == item["pk"]["S"]:
                found[record.batch] = record
        return found

    def update_trust(self, batch: str, change: Callable[[BatchTrust], BatchTrust | None]) -> BatchTrust | None:
        """Read the batch's trust, apply `change` (None: nothing to write), write it back only over
        the revision read; read again on a conflict. Returns what was written (or None)."""
        for _ in range(UPDATE_ATTEMPTS):
            item = self._get(trust_pk(batch), TRUST_SK)
            current = self._record(item, BatchTrust) if item is not None else BatchTrust(batch=batch)
            changed = change(current)
            if changed is None:
                return None
            changed = changed.model_copy(update={"decisions": changed.decisions[-DECISIONS_KEPT:]})
            try:
                self._put(
                    trust_pk(batch),
                    TRUST_SK,
                    changed,
                    revision=self._revision(item) + 1,
                    state=(TRUST_STATE, batch),
                )
            except ConcurrentUpdateError:
                continue
            return changed
        raise ConcurrentUpdateError(f"the trust of batch {batch} kept changing: try again")

    def forget_trust(self, batch: str) -> None:
        """The batch is erased (`retrain data purge`): its trust goes with it."""
        self._db.delete_item(TableName=self._table, Key={"pk": {"S": trust_pk(batch)}, "sk": {"S": TRUST_SK}})
