"""The ledger's training-job items: which job each run started, and the runs waiting for one.

- `run#<execution>` / `job`: the job name a run's "Start training" created, written before the
  job exists, so whatever ends a run (its failure branch, or the cleanup after a console stop or
  a timeout) finds the job to stop from the execution's name alone.
- `job#<job name>` / `waiting`: the task token of the state that waits for the job to end
  (`WaitingJob`). The job's state-change event, or the safety poll, sends the end back with it
  and deletes the item, conditional on the token, so a redelivered event sends nothing twice
  that matters. The sparse state index lists the waiting runs for the safety poll.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from functions.data.ledger_table import STATE_INDEX, LedgerTable, conditional_failed, iso
from functions.data.models import WaitingJob

WAITING_STATE = "job-waiting"


class JobItems(LedgerTable):
    def record_run_job(self, execution: str, job_name: str) -> None:
        self._db.put_item(
            TableName=self._table,
            Item={"pk": {"S": f"run#{execution}"}, "sk": {"S": "job"}, "job_name": {"S": job_name}},
        )

    def run_job(self, execution: str) -> str | None:
        """The job the run started (or was about to start); None before "Start training"."""
        item = self._get(f"run#{execution}", "job")
        return item["job_name"]["S"] if item else None

    def wait_for_job(self, waiting: WaitingJob) -> None:
        """Keep the wait's token (a retried wait state replaces the token it left before)."""
        self._db.put_item(
            TableName=self._table,
            Item={
                "pk": {"S": f"job#{waiting.job_name}"},
                "sk": {"S": "waiting"},
                "record": {"S": waiting.model_dump_json()},
                "token": {"S": waiting.token},
                "state_pk": {"S": WAITING_STATE},
                "state_sk": {"S": iso(waiting.since)},
            },
        )

    def waiting_job(self, job_name: str) -> WaitingJob | None:
        item = self._get(f"job#{job_name}", "waiting")
        return self._record(item, WaitingJob) if item else None

    def waiting_jobs(self) -> list[WaitingJob]:
        """Every run waiting for its job, longest waiting first."""
        items = self._query(
            IndexName=STATE_INDEX,
            KeyConditionExpression="state_pk = :state",
            ExpressionAttributeValues={":state": {"S": WAITING_STATE}},
        )
        return [self._record(item, WaitingJob) for item in items]

    def forget_wait(self, job_name: str, token: str) -> bool:
        """Drop the wait, if it still holds this token; False if another already did (or a newer
        wait replaced it)."""
        request: dict[str, Any] = {
            "TableName": self._table,
            "Key": {"pk": {"S": f"job#{job_name}"}, "sk": {"S": "waiting"}},
            "ConditionExpression": "#token = :token",
            "ExpressionAttributeNames": {"#token": "token"},
            "ExpressionAttributeValues": {":token": {"S": token}},
        }
        try:
            self._db.delete_item(**request)
        except ClientError as error:
            if conditional_failed(error):
                return False
            raise
        return True
