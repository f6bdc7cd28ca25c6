"""An engineer's state machine runs offline exactly as its ASL says, on moto's real engine."""

from __future__ import annotations

import json

import pytest

from retrain.local.stack import OfflineStack
from tests.integration.helpers import TopicInbox, add_test_function, create_machine, run_machine


def test_a_polling_loop_waits_until_the_job_is_done_then_tells_the_team(
    stack: OfflineStack,
) -> None:
    topic = stack.ref("NotificationTopic")
    inbox = TopicInbox(stack, topic)
    check = add_test_function(stack, "check-job", "check_job")
    machine = create_machine(
        stack, "poll_until_done.asl.json", CheckFunctionArn=check, TopicArn=topic
    )

    result = run_machine(stack, machine, "poll-1", {"polls_needed": 3, "poll_seconds": 0})

    assert result["status"] == "SUCCEEDED", result
    entered = [
        event["stateEnteredEventDetails"]["name"]
        for event in stack.history(result["executionArn"])
        if "stateEnteredEventDetails" in event
    ]
    assert entered == [
        "Ask whether the job is done",
        "Is the job done?",
        "Wait before asking again",
        "Ask whether the job is done",
        "Is the job done?",
        "Wait before asking again",
        "Ask whether the job is done",
        "Is the job done?",
        "Tell the team",
    ]
    assert [m["Message"] for m in inbox.messages()] == ["job done after 3 polls"]
    assert [i.function for i in stack.runtime.invocations] == ["check-job"] * 3


def test_a_handler_error_is_retried_by_name_then_caught(stack: OfflineStack) -> None:
    broken = add_test_function(stack, "broken-job", "always_broken")
    machine = create_machine(stack, "retry_then_catch.asl.json", BrokenFunctionArn=broken)

    result = run_machine(stack, machine, "broken-1", {"job": "nightly"})

    assert result["status"] == "FAILED"
    assert result["error"] == "GaveUp"
    assert json.loads(result["cause"])["errorMessage"] == "attempt for nightly failed"
    history = stack.history(result["executionArn"])
    failures = [e["taskFailedEventDetails"] for e in history if e["type"] == "TaskFailed"]
    # One first attempt and two retries, each failing under the exception's class name.
    assert [f["error"] for f in failures] == ["JobStillBrokenError"] * 3
    assert len(stack.runtime.invocations) == 3


@pytest.fixture
def manifest(stack: OfflineStack) -> str:
    bucket = stack.ref("DataBucket")
    lines = [
        json.dumps({"image": f"images/b1/{i}.jpg", "label": f"labels/b1/{i}.png"}) for i in range(3)
    ]
    stack.aws.s3.put_object(
        Bucket=bucket, Key="dataset/manifests/v-2026-12-01.jsonl", Body="\n".join(lines) + "\n"
    )
    return "v-2026-12-01"


def test_a_retraining_run_on_an_existing_dataset_version_tells_the_team_it_started(
    stack: OfflineStack, manifest: str
) -> None:
    inbox = TopicInbox(stack, stack.ref("NotificationTopic"))

    result = run_machine(
        stack, stack.ref("RetrainStateMachine"), manifest, {"dataset_version": manifest}
    )

    assert result["status"] == "SUCCEEDED", result
    output = json.loads(result["output"])
    assert output["pair_count"] == 3
    assert output["manifest_uri"].endswith(f"dataset/manifests/{manifest}.jsonl")
    messages = inbox.messages()
    assert [m["Subject"] for m in messages] == ["Retraining started"]
    assert messages[0]["Message"] == f"Retraining started on dataset version {manifest} (3 pairs)."


def test_a_run_for_a_missing_dataset_version_fails_and_tells_the_team_why(
    stack: OfflineStack,
) -> None:
    inbox = TopicInbox(stack, stack.ref("NotificationTopic"))

    result = run_machine(
        stack, stack.ref("RetrainStateMachine"), "v-missing", {"dataset_version": "v-missing"}
    )

    assert result["status"] == "FAILED"
    assert result["error"] == "RetrainFailed"
    assert json.loads(result["cause"])["errorType"] == "DatasetVersionNotFoundError"
    (message,) = inbox.messages()
    assert message["Subject"] == "Retraining failed"
    assert message["Message"].startswith("Retraining failed: DatasetVersionNotFoundError: ")
    assert "v-missing" in message["Message"]


def test_a_run_started_with_input_that_names_no_version_fails_by_name(stack: OfflineStack) -> None:
    result = run_machine(stack, stack.ref("RetrainStateMachine"), "no-version", {"version": "x"})

    assert result["status"] == "FAILED"
    assert json.loads(result["cause"])["errorType"] == "InvalidRunInputError"
