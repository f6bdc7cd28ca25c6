"""A failed run's message and summary.json name the state that failed, read from its execution's
history: every Catch sends the run to the same failure branch, and nothing writes the name down.

Step Functions is a stubbed client (each request checked against botocore's model); the bucket
and the topic are in memory.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from functions.common.requests import NotifyRequest
from functions.common.summary import RunSummary
from functions.notify.history import FAILURE_BRANCH, failed_state
from functions.notify.logic import Notifier
from tests.conftest import load_event
from tests.unit.fakes import FakeS3, FakeSNS, stubbed

BUCKET = "retrain-data-123456789012-us-east-1"
RUN = "ds-20261203-091500-4f1c2a9b"
EXECUTION_ARN = f"arn:aws:states:us-east-1:123456789012:execution:retrain-retrain:{RUN}"
WHEN = datetime(2026, 12, 3, 9, 20, tzinfo=UTC)


def entered(*names: str, first_id: int = 1) -> list[dict[str, Any]]:
    """The history's TaskStateEntered-like events of these states, in order (with an exit between)."""
    events = []
    for offset, name in enumerate(names):
        events.append(
            {
                "timestamp": WHEN,
                "type": "TaskStateEntered",
                "id": first_id + 2 * offset,
                "stateEnteredEventDetails": {"name": name},
            }
        )
        events.append(
            {
                "timestamp": WHEN,
                "type": "TaskStateExited",
                "id": first_id + 2 * offset + 1,
                "stateExitedEventDetails": {"name": name},
            }
        )
    return events


def history_request(token: str | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {"executionArn": EXECUTION_ARN, "includeExecutionData": False}
    if token is not None:
        request["nextToken"] = token
    return request


def notifier(sfn: Any, s3: FakeS3, sns: FakeSNS) -> Notifier:
    return Notifier(
        s3=s3,  # type: ignore[arg-type]
        sns=sns,  # type: ignore[arg-type]
        sts=None,  # type: ignore[arg-type]
        bucket=BUCKET,
        topic_arn="arn:aws:sns:us-east-1:123456789012:retrain-notifications",
        region="us-east-1",
        report_reader_role_arn="",
        webhook=lambda: None,
        sfn=sfn,
    )


def failed_request() -> NotifyRequest:
    """What "Tell the team the run failed" sends: the whole state, its error, no failed state."""
    state = load_event("run_failed_state.json")
    del state["failed_state"]
    return NotifyRequest(kind="failed", execution=RUN, execution_arn=EXECUTION_ARN, state=state)


def test_the_failed_state_is_the_last_one_entered_before_the_failure_branch_over_several_pages() -> None:
    polled = ["Wait for the FSx import", "Check the FSx import", "Is the FSx import done?"] * 3
    first = entered("Check that the dataset version exists", "Copy the dataset to FSx", *polled)
    second = entered("Wait for the FSx import", "Check the FSx import", *FAILURE_BRANCH[:2], first_id=len(first) + 1)

    with stubbed("stepfunctions") as (sfn, stub):
        stub.add_response("get_execution_history", {"events": first, "nextToken": "page-2"}, history_request())
        stub.add_response("get_execution_history", {"events": second}, history_request("page-2"))

        assert failed_state(sfn, EXECUTION_ARN) == "Check the FSx import"


def test_the_team_is_told_at_which_state_the_run_failed_and_its_summary_says_so() -> None:
    s3, sns = FakeS3(), FakeSNS()
    history = entered("Check that the dataset version exists", "Copy the dataset to FSx", "Wait for the FSx import")
    history += entered("Check the FSx import", *FAILURE_BRANCH[:2], first_id=len(history) + 1)

    with stubbed("stepfunctions") as (sfn, stub):
        stub.add_response("get_execution_history", {"events": history}, history_request())
        notified = notifier(sfn, s3, sns).notify(failed_request(), now=WHEN)

    assert notified.subject == f"Retraining failed at Check the FSx import - {RUN}"
    assert sns.published[0]["Subject"] == notified.subject
    summary = RunSummary.model_validate_json(
        s3.get_object(Bucket=BUCKET, Key=f"reports/failures/{RUN}/summary.json")["Body"].read()
    )
    assert (summary.outcome, summary.failed_state, summary.error) == (
        "failed",
        "Check the FSx import",
        "FsxImportFailedError",
    )


def test_a_state_named_by_the_caller_is_not_looked_up() -> None:
    """RunEndedFunction and `retrain runs cancel` say where the run was: no history is read."""
    s3, sns = FakeS3(), FakeSNS()
    request = failed_request()
    assert request.state is not None
    request = request.model_copy(update={"state": request.state.model_copy(update={"failed_state": "Start training"})})

    with stubbed("stepfunctions") as (sfn, _):
        notified = notifier(sfn, s3, sns).notify(request, now=WHEN)

    assert notified.subject == f"Retraining failed at Start training - {RUN}"


def test_a_history_that_cannot_be_read_still_tells_the_team() -> None:
    s3, sns = FakeS3(), FakeSNS()

    with stubbed("stepfunctions") as (sfn, stub):
        stub.add_client_error(
            "get_execution_history",
            "AccessDeniedException",
            "not authorized to perform: states:GetExecutionHistory",
            expected_params=history_request(),
        )
        notified = notifier(sfn, s3, sns).notify(failed_request(), now=WHEN)

    assert notified.outcome == "failed" and len(sns.published) == 1
    summary = json.loads(s3.get_object(Bucket=BUCKET, Key=f"reports/failures/{RUN}/summary.json")["Body"].read())
    assert summary["failed_state"] == "unknown"
