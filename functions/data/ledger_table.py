"""The ledger's table: how a record becomes an item, and the reads and conditional writes every
kind of item shares. `ledger_batches.py` and `ledger_pairs.py` hold the item layout of each kind;
`ledger.py` puts them together.

Each record is stored whole as JSON (`record`), beside the few attributes that keys, the sparse
state index and conditional writes need. Pairs and batches carry a revision number: every write
is conditional on the revision read, so two functions racing on one pair cannot both win.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import ClientError
from pydantic import BaseModel

from functions.common.errors import ConcurrentUpdateError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

STATE_INDEX = "state"
RecordT = TypeVar("RecordT", bound=BaseModel)


def iso(moment: datetime) -> str:
    return moment.isoformat()


def conditional_failed(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


class LedgerTable:
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
        unless_status: str | None = None,
    ) -> None:
        """Write a record; with `revision`, only if the stored one still has `revision - 1`; with
        `unless_status`, only if there is none or its status is another."""
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
        elif unless_status is not None:
            request["ConditionExpression"] = "attribute_not_exists(pk) OR #status <> :kept"
            request["ExpressionAttributeNames"] = {"#status": "status"}  # a reserved word
            request["ExpressionAttributeValues"] = {":kept": {"S": unless_status}}
        try:
            self._db.put_item(**request)
        except ClientError as error:
            if conditional_failed(error):
                why = "changed while we worked on it" if unless_status is None else f"was {unless_status} meanwhile"
                raise ConcurrentUpdateError(f"{pk} {sk} {why}") from error
            raise

    def _put_if(self, request: dict[str, Any]) -> bool:
        """A conditional PutItem: False when its condition did not hold (nothing written)."""
        try:
            self._db.put_item(**request)
        except ClientError as error:
            if conditional_failed(error):
                return False
            raise
        return True

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
