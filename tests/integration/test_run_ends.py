"""Every way a run ends, on the offline stack (issue 27): the wait for the training job is answered
by the job's event, or by the safety poll when the event is lost; a run stopped from the console
has its job stopped, its team told once (a redelivered end event tells nobody again; a message
that failed is sent by the retry) and its lock freed; a message that cannot be sent does not
undo an accepted run.

The real state machine on moto's engine, the real functions, the SageMaker emulator running the
real trainer, and EventBridge's delivery played by the offline stack (`stack.eventbridge`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest

from functions.data.ledger import Ledger
from functions.notify.logic import Notifier
from retrain.local.cloudformation.stack import OfflineStack, StackOptions
from retrain.local.events.eventbridge import EXECUTION_STATUS_CHANGE, execution_status_detail
from retrain.local.events.notifications import Misbehaviour
from retrain.local.lambda_runtime.lambdas import Invocation
from retrain.runs import CancelOutcome, Runs, release_through
from tests.integration.conftest import DATA, TRAINING
from tests.integration.data_drops import drain, executions, wait_until
from tests.integration.runs import drop_with_validation, history_states, job_names, read_json, run_to_end

pytestmark = pytest.mark.slow(seconds=40)  # the longest test here, on 2 cores

SAFETY_POLL = {"action": "sweep"}
TRAINING_JOBS = "retrain-local-TrainingJobFunction"
NOTIFY = "retrain-local-NotifyFunction"
RUN_ENDED = "retrain-local-RunEndedFunction"


@pytest.fixture
def stack() -> Iterator[OfflineStack]:
    options = StackOptions(parameters={**DATA, **TRAINING}, poll=False, tick=False, batching_window_seconds=0)
    with OfflineStack(options) as offline:
        yield offline


def running_run(stack: OfflineStack) -> dict[str, Any]:
    drain(stack)
    wait_until(lambda: len(executions(stack)) == 1, timeout=60, message="a run to start")
    (run,) = executions(stack)
    return run


def lock_is_free(stack: OfflineStack) -> bool:
    key = {"pk": {"S": "lock#retrain"}, "sk": {"S": "lock"}}
    return "Item" not in stack.aws.dynamodb.get_item(TableName=stack.ref("LedgerTable"), Key=key)


def job_status(stack: OfflineStack, name: str) -> str:
    return str(stack.aws.sagemaker.describe_training_job(TrainingJobName=name)["TrainingJobStatus"])


def test_the_run_waits_for_its_job_by_the_jobs_event_and_never_polls_it(stack: OfflineStack) -> None:
    drop_with_validation(stack, "munich-40", train=4, val=1)

    run = run_to_end(stack)

    assert run["status"] == "SUCCEEDED", run
    states = history_states(stack, run["executionArn"])
    assert states.count("Wait for the training job to end") == 1, "one wait, answered once"
    assert "Check the training job" not in states
    (job,) = job_names(stack)
    delivered = [d for d in stack.eventbridge.deliveries if d.event["source"] == "aws.sagemaker" and d.accepted]
    assert any(e.event["detail"]["TrainingJobName"] == job for e in delivered)


def test_a_lost_job_event_costs_one_safety_poll_not_the_run(stack: OfflineStack) -> None:
    stack.eventbridge.lose(lambda event: event["source"] == "aws.sagemaker")
    drop_with_validation(stack, "munich-41", train=4, val=1)
    run = running_run(stack)
    wait_until(lambda: job_names(stack) and job_status(stack, job_names(stack)[0]) == "Completed", timeout=120)

    assert stack.aws.stepfunctions.describe_execution(executionArn=run["executionArn"])["status"] == "RUNNING"
    swept = stack.runtime.invoke(TRAINING_JOBS, SAFETY_POLL)
    assert not swept.failed, swept.payload

    ended = stack.wait_for_execution(run["executionArn"], timeout=120)
    assert ended["status"] == "SUCCEEDED", ended
    assert [s["outcome"] for s in swept.payload["settled"]] == ["succeeded"]


def waiting_for_the_job(stack: OfflineStack, execution_arn: str) -> bool:
    entered = [
        e["stateEnteredEventDetails"]["name"] for e in stack.history(execution_arn) if "stateEnteredEventDetails" in e
    ]
    return "Wait for the training job to end" in entered


def stopped_while_training(stack: OfflineStack, batch: str) -> tuple[dict[str, Any], str]:
    """A run stopped from the console while its job trains: the run and its job."""
    # Long enough to be stopped in the middle.
    stack.update_function_environment(
        "TrainingJobFunction", TRAINING_EXTRA_HYPERPARAMETERS='{"workers": 0, "epochs": 200}'
    )
    drop_with_validation(stack, batch, train=4, val=1)
    run = running_run(stack)
    wait_until(lambda: job_names(stack) and job_status(stack, job_names(stack)[0]) == "InProgress", timeout=120)
    (job,) = job_names(stack)
    # The job runs as soon as "Start training" created it; the state machine is in its wait a
    # moment later. Stopped then, as an operator watching the console would.
    wait_until(lambda: waiting_for_the_job(stack, run["executionArn"]), timeout=60, message="the run to wait")
    stack.aws.stepfunctions.stop_execution(executionArn=run["executionArn"], cause="an operator stopped it")
    return run, job


def run_end_events(stack: OfflineStack) -> list[dict[str, Any]]:
    """The end events EventBridge handed RunEndedFunction."""
    function = stack.runtime.arn(stack.ref("RunEndedFunction"))
    return [d.event for d in stack.eventbridge.deliveries if d.function == function and d.accepted]


def run_ended_invocations(stack: OfflineStack) -> list[Any]:
    return [i for i in stack.runtime.invocations if i.function == stack.ref("RunEndedFunction")]


def test_a_run_stopped_from_the_console_stops_its_job_tells_the_team_and_frees_the_lock(
    stack: OfflineStack,
) -> None:
    inbox = stack.topic_inbox()

    run, job = stopped_while_training(stack, "munich-42")

    wait_until(lambda: job_status(stack, job) in {"Stopping", "Stopped"}, timeout=120, message="the job to stop")
    wait_until(lambda: lock_is_free(stack), timeout=120, message="the lock to be free")
    (email,) = inbox.receive(wait_seconds=5)
    assert email["Subject"].startswith("Retraining stopped"), email["Subject"]
    assert "an operator stopped it" in email["Message"], email["Message"]
    assert "Wait for the training job to end" in email["Message"], email["Message"]
    summary = read_json(stack, f"reports/failures/{run['name']}/summary.json")
    assert summary["outcome"] == "stopped"

    # EventBridge delivers at least once: the same end again tells nobody a second time.
    (event,) = run_end_events(stack)
    again = stack.runtime.invoke(stack.ref("RunEndedFunction"), event)
    assert not again.failed and (again.payload["released"], again.payload["told"]) == (False, False), again.payload
    assert inbox.receive(wait_seconds=3) == [], "one message per run end"


def test_a_run_end_whose_message_failed_is_told_by_the_retry_and_only_once(stack: OfflineStack) -> None:
    """RunEndedFunction frees the lock, recording the run's end, and the message fails (SNS
    refuses): the invocation fails, as Lambda then retries it; the retry sends the message. The
    lock was freed once, and the team is told once."""
    inbox = stack.topic_inbox()
    topic = stack.ref("NotificationTopic")
    stack.update_function_environment("NotifyFunction", NOTIFICATION_TOPIC_ARN=topic + "-deleted")

    _, job = stopped_while_training(stack, "munich-47")

    wait_until(lambda: run_ended_invocations(stack), timeout=120, message="RunEndedFunction to run")
    (first,) = run_ended_invocations(stack)
    assert first.failed and first.error_type == "RunCleanupError", first.payload
    assert lock_is_free(stack), "freed, and the run's end recorded, before the message failed"
    stack.update_function_environment("NotifyFunction", NOTIFICATION_TOPIC_ARN=topic)
    (event,) = run_end_events(stack)

    retried = stack.runtime.invoke(stack.ref("RunEndedFunction"), event)  # Lambda's retry
    again = stack.runtime.invoke(stack.ref("RunEndedFunction"), event)  # and a redelivery

    assert not retried.failed and (retried.payload["released"], retried.payload["told"]) == (False, True)
    assert not again.failed and again.payload["told"] is False
    emails = inbox.receive(wait_seconds=5)
    emails += inbox.receive(wait_seconds=3)  # a second message would be here by now
    assert len(emails) == 1 and emails[0]["Subject"].startswith("Retraining stopped"), "told once"
    assert job_status(stack, job) in {"Stopping", "Stopped"}


def test_a_run_stopped_while_start_training_creates_its_job_ends_with_the_job_stopped(stack: OfflineStack) -> None:
    """Step Functions does not stop a Lambda function it waits for. The run is stopped, and
    RunEndedFunction cleans up after it, while "Start training" is between recording the job's
    name and creating the job: the clean-up finds no job to stop. "Start training" then finds its
    run ended and stops the job it has just created."""
    assert stack.training is not None
    create = stack.training.create_training_job
    cleaned_up: list[dict[str, Any]] = []
    # Its one delivery is played below, at the moment it would come.
    stack.eventbridge.lose(lambda event: event["source"] == "aws.states" and event["detail"]["status"] == "ABORTED")

    def stopped_before_the_create(params: dict[str, Any]) -> dict[str, Any]:
        (run,) = executions(stack)
        sfn = stack.aws.stepfunctions
        sfn.stop_execution(executionArn=run["executionArn"], cause="an operator stopped it")
        # RunEndedFunction hears the end now, in this thread: the offline runtime runs one
        # invocation at a time, and would otherwise run it only after "Start training" returned.
        event = {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": EXECUTION_STATUS_CHANGE,
            "source": "aws.states",
            "account": stack.runtime.account_id,
            "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": stack.runtime.region,
            "resources": [run["executionArn"]],
            "detail": execution_status_detail(dict(sfn.describe_execution(executionArn=run["executionArn"]))),
        }
        cleaned_up.append(stack.runtime.invoke(RUN_ENDED, event).payload)
        return create(params)

    stack.emulators.register("sagemaker", "CreateTrainingJob", stopped_before_the_create)
    drop_with_validation(stack, "munich-46", train=4, val=1)
    run = running_run(stack)

    ended = stack.wait_for_execution(run["executionArn"], timeout=120)

    assert ended["status"] == "ABORTED", ended
    # ABORTED at once, as on AWS: "Start training" is still running.
    wait_until(lambda: starts(stack), timeout=120, message='"Start training" to return')
    (job,) = job_names(stack)
    (cleanup,) = cleaned_up
    assert (cleanup["job_name"], cleanup["job_stopped"], cleanup["released"], cleanup["told"]) == (
        job,
        False,
        True,
        True,
    ), "the run's end was cleaned up before its job existed"
    wait_until(lambda: job_status(stack, job) == "Stopped", timeout=60, message="the job to stop")
    started = starts(stack)[0]
    assert not started.failed and (started.payload["job_name"], started.payload["run_ended"]) == (job, "ABORTED")


def starts(stack: OfflineStack) -> list[Invocation]:
    """TrainingJobFunction's invocations: "Start training" first (then the job's own events)."""
    return [i for i in stack.runtime.invocations if i.function == TRAINING_JOBS]


def cancel(stack: OfflineStack, run: str, job_timeout: float) -> CancelOutcome:
    """`retrain runs cancel RUN`, its logic on this stack's clients."""
    aws = stack.aws
    runs = Runs(
        sfn=aws.stepfunctions,
        s3=aws.s3,
        bucket=stack.ref("DataBucket"),
        state_machine_arn=stack.ref("RetrainStateMachine"),
    )
    notifier = Notifier(
        s3=aws.s3,
        sns=aws.sns,
        sts=boto3.client("sts", region_name="us-east-1"),
        bucket=stack.ref("DataBucket"),
        topic_arn=stack.ref("NotificationTopic"),
        region="us-east-1",
        report_reader_role_arn="",
        webhook=lambda: None,
    )
    ledger = Ledger(aws.dynamodb, stack.ref("LedgerTable"))
    release = release_through(boto3.client("lambda", region_name="us-east-1"), stack.ref("ReleaseFunction"), "ops")
    return runs.cancel(
        run,
        sagemaker=aws.sagemaker,
        ledger=ledger,
        notifier=notifier,
        who="ops",
        release=release,
        job_timeout=job_timeout,
    )


@pytest.mark.parametrize("run_ended_hears", [True, False], ids=["by RunEndedFunction", "without its event"])
def test_a_cancel_is_cleaned_up_once_with_or_without_run_ended(stack: OfflineStack, run_ended_hears: bool) -> None:
    """`retrain runs cancel` stops the execution and leaves the rest to RunEndedFunction; if its
    event never comes, the cancel does the same itself. Either way: one message, job stopped, lock free."""
    if not run_ended_hears:
        stack.eventbridge.lose(lambda event: event["source"] == "aws.states")
    inbox = stack.topic_inbox()
    stack.update_function_environment(
        "TrainingJobFunction", TRAINING_EXTRA_HYPERPARAMETERS='{"workers": 0, "epochs": 200}'
    )
    drop_with_validation(stack, "munich-45", train=4, val=1)
    run = running_run(stack)
    wait_until(lambda: job_names(stack) and job_status(stack, job_names(stack)[0]) == "InProgress", timeout=120)
    (job,) = job_names(stack)

    outcome = cancel(stack, run["name"], job_timeout=20 if run_ended_hears else 3)

    assert outcome.cleaned_up_by == ("RunEndedFunction" if run_ended_hears else "this command"), outcome
    assert outcome.job_name == job and outcome.told_team, outcome
    wait_until(lambda: job_status(stack, job) == "Stopped", timeout=60, message="the job to stop")
    assert lock_is_free(stack)
    emails = inbox.receive(wait_seconds=5)
    emails += inbox.receive(wait_seconds=3)  # a second message would be here by now
    assert len(emails) == 1 and emails[0]["Subject"].startswith("Retraining stopped"), "told once"
    assert "cancelled by ops" in emails[0]["Message"], emails[0]["Message"]
    summary = read_json(stack, f"reports/failures/{run['name']}/summary.json")
    assert summary["outcome"] == "stopped" and "cancelled by ops" in summary["cause"]


def test_a_run_past_the_state_machines_timeout_stops_its_job_tells_the_team_and_frees_the_lock(
    stack: OfflineStack,
) -> None:
    """The template's TimeoutSeconds is 30 days; the same definition with 8 seconds plays it."""
    sfn = stack.aws.stepfunctions
    (machine,) = [m for m in sfn.list_state_machines()["stateMachines"] if m["name"].endswith("-retrain")]
    definition = json.loads(sfn.describe_state_machine(stateMachineArn=machine["stateMachineArn"])["definition"])
    sfn.update_state_machine(
        stateMachineArn=machine["stateMachineArn"], definition=json.dumps({**definition, "TimeoutSeconds": 8})
    )
    inbox = stack.topic_inbox()
    stack.update_function_environment(
        "TrainingJobFunction", TRAINING_EXTRA_HYPERPARAMETERS='{"workers": 0, "epochs": 200}'
    )
    drop_with_validation(stack, "munich-44", train=4, val=1)
    run = running_run(stack)

    ended = stack.wait_for_execution(run["executionArn"], timeout=120)

    assert ended["status"] == "TIMED_OUT", ended
    (job,) = job_names(stack)
    wait_until(lambda: job_status(stack, job) in {"Stopping", "Stopped"}, timeout=120, message="the job to stop")
    wait_until(lambda: lock_is_free(stack), timeout=120, message="the lock to be free")
    (email,) = inbox.receive(wait_seconds=5)
    assert email["Subject"].startswith("Retraining failed"), email["Subject"]
    assert "TimeoutSeconds" in email["Message"], email["Message"]


def test_with_sns_and_slack_down_after_acceptance_the_run_succeeds_and_the_model_stays_accepted(
    stack: OfflineStack,
) -> None:
    assert stack.slack is not None
    stack.slack.misbehave(*[Misbehaviour(500, "internal_error")] * 10)
    missing = stack.ref("NotificationTopic") + "-deleted"
    stack.update_function_environment("NotifyFunction", NOTIFICATION_TOPIC_ARN=missing)
    drop_with_validation(stack, "munich-43", train=4, val=1)

    run = run_to_end(stack)

    assert run["status"] == "SUCCEEDED", run
    states = history_states(stack, run["executionArn"])
    assert "The team could not be told" in states and "Tell the team the run failed" not in states
    assert read_json(stack, "models/accepted.json")["run"] == run["name"], "the model stays accepted"
    failed = [i for i in stack.runtime.invocations if i.function == NOTIFY and i.failed]
    assert failed, "the failed message is counted (the function's Errors metric and FunctionErrorsAlarm)"
