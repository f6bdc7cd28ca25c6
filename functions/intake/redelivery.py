"""What the intake does on its own queue so that a record that kills its invocation dies alone.

A record that raises is reported alone (a partial batch failure). A record that ends the whole
invocation (a timeout, a crash of the process) is another matter: Lambda then returns the whole
batch, and each record in it counts a delivery towards maxReceiveCount. Redelivered with the
same records, it would take them with it to the dead-letter queue. Two things keep them apart:

- Before a record delivered before (a suspect) is started, the records this invocation has
  finished are deleted from the queue (`delete_finished`): if the suspect ends the invocation,
  only it and the records not yet started come back.
- While a suspect runs, a marker names its message in the idempotency table (`started`); it is
  removed when the record ends, whatever its outcome. A marker still there at the next delivery
  says that this record was running when an invocation died (`died_running`): it goes last in its
  batch, after every other record is done and deleted, and dies alone.

First deliveries write no marker and delete nothing themselves: the common path costs no call.
Also here: a record left unstarted for lack of time is sent to the queue again as a new message
(`send_again`), so that waiting costs it no delivery.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

# Markers share the idempotency table (`id` key, `expiration` TTL) under a prefix of their own.
MARKER_PREFIX = "intake.running#"
# A marker outlives any redelivery it must be seen at (the queue's visibility timeout, at most
# 12 hours), and then expires.
MARKER_TTL_SECONDS = 24 * 3600
_DELETE_BATCH = 10  # SQS's most per DeleteMessageBatch


@dataclass
class IntakeQueue:
    sqs: SQSClient
    queue_url: str
    dynamodb: DynamoDBClient
    table: str
    finished: dict[str, str] = field(default_factory=dict)  # message id -> receipt handle, not yet deleted

    def send_again(self, body: str) -> None:
        """A record left unstarted, as a new message: its receive count starts again."""
        self.sqs.send_message(QueueUrl=self.queue_url, MessageBody=body)

    def done(self, message_id: str, receipt_handle: str) -> None:
        self.finished[message_id] = receipt_handle

    def delete_finished(self) -> None:
        """Delete the finished records' messages now, before a suspect is started (Lambda's own
        delete of them, after the invocation, then finds them gone). One that cannot be deleted
        (SQS still failing after botocore's retries) is left to Lambda: the suspect is not blamed."""
        entries = list(self.finished.items())
        self.finished.clear()
        for start in range(0, len(entries), _DELETE_BATCH):
            chunk = entries[start : start + _DELETE_BATCH]
            with contextlib.suppress(BotoCoreError, ClientError):
                self.sqs.delete_message_batch(
                    QueueUrl=self.queue_url,
                    Entries=[{"Id": str(i), "ReceiptHandle": receipt} for i, (_, receipt) in enumerate(chunk)],
                )

    def started(self, message_id: str) -> None:
        expires = int(time.time()) + MARKER_TTL_SECONDS
        self.dynamodb.put_item(
            TableName=self.table,
            Item={"id": {"S": MARKER_PREFIX + message_id}, "expiration": {"N": str(expires)}},
        )

    def ended(self, message_id: str) -> None:
        """Remove the marker; one that cannot be removed expires, and only orders its record last."""
        with contextlib.suppress(BotoCoreError, ClientError):
            self.dynamodb.delete_item(TableName=self.table, Key={"id": {"S": MARKER_PREFIX + message_id}})

    def died_running(self, message_ids: list[str]) -> set[str]:
        """Of these (suspects') messages, those whose marker is still there."""
        return {
            message_id
            for message_id in message_ids
            if "Item" in self.dynamodb.get_item(TableName=self.table, Key={"id": {"S": MARKER_PREFIX + message_id}})
        }
