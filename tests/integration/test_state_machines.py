"""An engineer's state machine runs offline exactly as its ASL says, on moto's real engine."""

from __future__ import annotations

import json

from retrain.local.stack import OfflineStack
from tests.integration.helpers import TopicInbox, add_test_function, create_machine, run_machine
from tests.integration.runs import history_states


def test_a_polling_loop_waits_until_the_job_is_done_then_tells_the_team(
    stack: OfflineStack,
) -> None:
    topic = stack.ref("NotificationTopic")
    inbox = TopicInbox(stack, topic)
    check = add_test_function(stack, "check-job", "check_job")
    machine = create_machine(stack, "poll_until_done.asl.json", CheckFunctionArn=check, TopicArn=topic)

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


def test_a_run_for_a_missing_dataset_version_fails_and_tells_the_team_why(
    stack: OfflineStack,
) -> None:
    inbox = TopicInbox(stack, stack.ref("NotificationTopic"))

    result = run_machine(stack, stack.ref("RetrainStateMachine"), "v-missing", {"dataset_version": "v-missing"})

    assert result["status"] == "FAILED"
    assert result["error"] == "RetrainFailed"
    assert json.loads(result["cause"])["errorType"] == "DatasetVersionNotFoundError"
    (message,) = inbox.messages()
    assert message["Subject"] == "Retraining failed at Check that the dataset version exists - v-missing"
    assert "Error:      DatasetVersionNotFoundError" in message["Message"]
    assert "dataset version 'v-missing' has no manifest" in message["Message"]
    assert history_states(stack, result["executionArn"])[-3:] == [
        "Tell the team the run failed",
        "Release the lock after the failure",
        "Run failed",
    ], "a failure before any job still tells the team and releases the lock"


def test_a_run_started_with_input_that_names_no_version_fails_by_name(stack: OfflineStack) -> None:
    result = run_machine(stack, stack.ref("RetrainStateMachine"), "no-version", {"version": "x"})

    assert result["status"] == "FAILED"
    assert json.loads(result["cause"])["errorType"] == "InvalidRunInputError"
    assert "Tell the team the run failed" in history_states(stack, result["executionArn"]), (
        "caught and told, not an uncatchable States.Runtime error"
    )
