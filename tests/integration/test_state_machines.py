"""An engineer's state machine runs offline exactly as its ASL says, on moto's real engine."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from moto.stepfunctions.parser.utils import TMP_THREADS

from retrain.local.cloudformation.stack import OfflineStack, StackOptions
from tests.integration.data_drops import wait_until
from tests.integration.helpers import add_test_function, create_machine, run_machine
from tests.integration.runs import history_states


@pytest.fixture
def stack_with(request: pytest.FixtureRequest) -> Iterator[OfflineStack]:
    """A stack with template parameters of the test's choosing (parametrize it indirectly)."""
    with OfflineStack(StackOptions(parameters=request.param, poll=False, tick=False)) as offline:
        yield offline


def test_a_polling_loop_waits_until_the_job_is_done_then_tells_the_team(
    stack: OfflineStack,
) -> None:
    topic = stack.ref("NotificationTopic")
    inbox = stack.topic_inbox()
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
    assert [m["Message"] for m in inbox.receive()] == ["job done after 3 polls"]
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
    inbox = stack.topic_inbox()

    result = run_machine(stack, stack.ref("RetrainStateMachine"), "v-missing", {"dataset_version": "v-missing"})

    assert result["status"] == "FAILED"
    assert result["error"] == "RetrainFailed"
    assert json.loads(result["cause"])["errorType"] == "DatasetVersionNotFoundError"
    (message,) = inbox.receive()
    assert message["Subject"] == "Retraining failed at Check that the dataset version exists - v-missing"
    assert re.search(r"Error:\s+DatasetVersionNotFoundError", message["Message"])
    assert "dataset version 'v-missing' has no manifest" in message["Message"]
    assert history_states(stack, result["executionArn"])[-3:] == [
        "Release the lock after the failure",
        "Tell the team the run failed",
        "Run failed",
    ], "a failure before any job still releases the lock and tells the team"


def test_a_run_started_with_input_that_names_no_version_fails_by_name(stack: OfflineStack) -> None:
    result = run_machine(stack, stack.ref("RetrainStateMachine"), "no-version", {"version": "x"})

    assert result["status"] == "FAILED"
    assert json.loads(result["cause"])["errorType"] == "InvalidRunInputError"
    assert "Tell the team the run failed" in history_states(stack, result["executionArn"]), (
        "caught and told, not an uncatchable States.Runtime error"
    )


@pytest.mark.parametrize("stack_with", [{"NotifyOnStart": "true", "PollSeconds": "0"}], indirect=True)
def test_a_team_that_asked_for_it_is_told_when_a_run_starts_and_again_when_it_ends(stack_with: OfflineStack) -> None:
    inbox = stack_with.topic_inbox()
    assert stack_with.fsx is not None
    stack_with.fsx.fail_next_task("the import was cancelled by an operator")
    version = "ds-20261203-120000-0a1b2c3d"
    manifest = json.dumps({"image": "images/b/x.jpg", "label": "labels/b/x.png", "batch": "b"}) + "\n"
    stack_with.aws.s3.put_object(
        Bucket=stack_with.ref("DataBucket"), Key=f"dataset/manifests/{version}.jsonl", Body=manifest
    )

    result = run_machine(stack_with, stack_with.ref("RetrainStateMachine"), version, {"dataset_version": version})

    assert result["status"] == "FAILED"
    subjects = [message["Subject"] for message in inbox.receive(wait_seconds=1)]
    assert subjects == [f"Retraining started - {version}", f"Retraining failed at Check the FSx import - {version}"]


@pytest.mark.parametrize("end", ["timed out", "stopped"])
def test_a_task_waiting_for_its_token_ends_with_its_execution(stack: OfflineStack, end: str) -> None:
    """On AWS an execution that timed out or was stopped has ended, tasks and all. moto 5.2.5 left
    such a task asleep until its heartbeat ran out (25 minutes here), its threads alive: every
    later stack then waited for them when it stopped (retrain/local/endpoint/moto_fixes.py)."""
    answers_nothing = add_test_function(stack, "answers-nothing", "show_environment")
    machine = create_machine(stack, "waits_for_its_token.asl.json", FunctionArn=answers_nothing)
    sfn = stack.aws.stepfunctions
    before = {thread for thread in TMP_THREADS if thread.is_alive()}
    arn = sfn.start_execution(stateMachineArn=machine, name=f"token-{end.split(maxsplit=1)[0]}")["executionArn"]
    wait_until(lambda: len(stack.runtime.invocations) == 1, message="the task to wait for its token")
    if end == "stopped":
        sfn.stop_execution(executionArn=arn, error="Stopped", cause="by the test")

    ended = stack.wait_for_execution(arn, timeout=30)

    assert ended["status"] == ("TIMED_OUT" if end == "timed out" else "ABORTED"), ended
    wait_until(
        lambda: not [thread for thread in TMP_THREADS if thread.is_alive() and thread not in before],
        timeout=5,
        message="the execution's threads to end",
    )
