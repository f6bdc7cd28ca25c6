"""The ledger's run-end items: a run's end as recorded by whoever freed its lock owing the team
the run's message, and where that one message stands.

- `run#<execution>` / `end` (`RunEnd`): written in one transaction with the release of the run's
  lock (`release_lock_recording_end`): the lock's conditional delete and this item's conditional
  put succeed or fail together, so of several releasers exactly one records the end, and a run's
  end is recorded once. Its `message` attribute then goes owed -> sending (one sender's claim:
  `claim`, `claimed_until`) -> sent, every step conditional on the step before
  (`functions/notify/once.py` sends through it); the rest of the record is written once.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from functions.data.ledger_batches import LOCK_PK
from functions.data.ledger_table import LedgerTable, conditional_failed, iso
from functions.data.models import RunEnd, RunEndMessage

END_SK = "end"
# Two releases of one lock at the same moment (a duplicated end event) make DynamoDB cancel one
# transaction as a conflict, not a failed condition: it is tried again, and then finds the lock gone.
TRANSACTION_ATTEMPTS = 5
_NAMES = {"#message": "message", "#claim": "claim", "#until": "claimed_until"}


def run_end_pk(run: str) -> str:
    return f"run#{run}"


class RunEndItems(LedgerTable):
    def release_lock_recording_end(self, end: RunEnd) -> bool:
        """Free the lock if `end.run` holds it and record the run's end, together; False, and
        nothing written, when the lock is not that run's (freed before, or another's) or the end
        is recorded already."""
        transaction: Any = [
            {
                "Delete": {
                    "TableName": self._table,
                    "Key": {"pk": {"S": LOCK_PK}, "sk": {"S": "lock"}},
                    "ConditionExpression": "holder = :holder",
                    "ExpressionAttributeValues": {":holder": {"S": end.run}},
                }
            },
            {
                "Put": {
                    "TableName": self._table,
                    "Item": {
                        "pk": {"S": run_end_pk(end.run)},
                        "sk": {"S": END_SK},
                        "record": {"S": end.model_dump_json(include={"run", "freed_by", "freed_at"})},
                        "message": {"S": RunEndMessage.OWED.value},
                    },
                    "ConditionExpression": "attribute_not_exists(pk)",
                }
            },
        ]
        attempt = 0
        while True:
            try:
                self._db.transact_write_items(TransactItems=transaction)
            except ClientError as error:
                reasons = _cancellation_codes(error)
                if "ConditionalCheckFailed" in reasons:
                    return False
                attempt += 1
                if "TransactionConflict" not in reasons or attempt >= TRANSACTION_ATTEMPTS:
                    raise
            else:
                return True
            time.sleep(0.05 * 2**attempt)

    def run_end(self, run: str) -> RunEnd | None:
        item = self._get(run_end_pk(run), END_SK)
        if item is None:
            return None
        fields: dict[str, Any] = {
            **RunEnd.model_validate_json(item["record"]["S"]).model_dump(include={"run", "freed_by", "freed_at"}),
            "message": item["message"]["S"],
        }
        if "claimed_until" in item:
            fields["claimed_until"] = datetime.fromtimestamp(float(item["claimed_until"]["N"]), UTC)
        if "sent_at" in item:
            fields["sent_at"] = item["sent_at"]["S"]
        if "message_id" in item:
            fields["message_id"] = item["message_id"]["S"]
        return RunEnd.model_validate(fields)

    def claim_run_end_message(self, run: str, token: str, *, now: datetime, until: datetime) -> bool:
        """Claim the message for one sender (`token`) until `until`: if it is owed, or if the claim
        of a sender who may have died has lapsed. False: sent, or another's claim still holds."""
        return self._update_if(
            run,
            "SET #message = :sending, #claim = :token, #until = :until",
            "#message = :owed OR (#message = :sending AND #until < :now)",
            {
                ":sending": {"S": RunEndMessage.SENDING.value},
                ":owed": {"S": RunEndMessage.OWED.value},
                ":token": {"S": token},
                ":until": {"N": f"{until.timestamp():.3f}"},
                ":now": {"N": f"{now.timestamp():.3f}"},
            },
            names=("#message", "#claim", "#until"),
        )

    def run_end_message_sent(self, run: str, token: str, *, at: datetime, message_id: str | None) -> bool:
        """Mark the message sent, if `token`'s claim still holds; False: it had lapsed and another
        sender took it over (who may send it a second time)."""
        values: dict[str, Any] = {
            ":sending": {"S": RunEndMessage.SENDING.value},
            ":sent": {"S": RunEndMessage.SENT.value},
            ":token": {"S": token},
            ":at": {"S": iso(at)},
        }
        setting = "SET #message = :sent, sent_at = :at"
        if message_id is not None:
            values[":id"] = {"S": message_id}
            setting += ", message_id = :id"
        return self._update_if(
            run,
            f"{setting} REMOVE #claim, #until",
            "#message = :sending AND #claim = :token",
            values,
            names=("#message", "#claim", "#until"),
        )

    def give_back_run_end_message(self, run: str, token: str) -> bool:
        """The message was not sent: owed again at once, if `token`'s claim still holds, so that
        the next sender need not wait for the claim to lapse."""
        return self._update_if(
            run,
            "SET #message = :owed REMOVE #claim, #until",
            "#message = :sending AND #claim = :token",
            {
                ":sending": {"S": RunEndMessage.SENDING.value},
                ":owed": {"S": RunEndMessage.OWED.value},
                ":token": {"S": token},
            },
            names=("#message", "#claim", "#until"),
        )

    def _update_if(
        self, run: str, update: str, condition: str, values: dict[str, Any], *, names: tuple[str, ...]
    ) -> bool:
        try:
            self._db.update_item(
                TableName=self._table,
                Key={"pk": {"S": run_end_pk(run)}, "sk": {"S": END_SK}},
                UpdateExpression=update,
                ConditionExpression=f"attribute_exists(pk) AND ({condition})",
                ExpressionAttributeNames={name: _NAMES[name] for name in names},
                ExpressionAttributeValues=values,
            )
        except ClientError as error:
            if conditional_failed(error):
                return False
            raise
        return True


def _cancellation_codes(error: ClientError) -> set[str]:
    """Why DynamoDB cancelled a transaction: each item's reason code (empty for another error)."""
    if error.response.get("Error", {}).get("Code") != "TransactionCanceledException":
        return set()
    reasons: Any = error.response.get("CancellationReasons", [])
    return {str(reason.get("Code")) for reason in reasons if reason.get("Code") not in (None, "None")}
