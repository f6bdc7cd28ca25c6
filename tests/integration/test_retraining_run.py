"""A retraining run, end to end: an annotation team's drop becomes a trained, judged, recorded model.

Every test drives the real state machine on moto's engine, with the real functions, the FSx
emulator and the SageMaker emulator running the real trainer (from the uploaded sourcedir.tar.gz)
under torchrun, and asserts on the execution's history and on what landed in the bucket.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest

from functions.common import prefixes
from functions.common.summary import RunSummary
from retrain.local.cloudformation.stack import OfflineStack, StackOptions
from retrain.local.events.notifications import Misbehaviour
from tests.integration.conftest import DATA, TRAINING
from tests.integration.data_drops import drain, executions, wait_until
from tests.integration.runs import drop_with_validation, history_states, job_names, read_json, run_to_end

pytestmark = pytest.mark.slow(seconds=30)  # the longest test here, on 2 cores
# Data-parallel for real: one process on each of two emulated hosts, joined in one process group.
TWO_HOSTS = {"TrainingInstanceCount": "2", "TrainingBatchSize": "2"}


@pytest.fixture
def stack(request: pytest.FixtureRequest) -> Iterator[OfflineStack]:
    overrides = getattr(request, "param", {})
    options = StackOptions(
        parameters={**DATA, **TRAINING, **TWO_HOSTS, **overrides.get("parameters", {})},
        poll=False,
        tick=False,
        batching_window_seconds=0,
        rule_delay_seconds=overrides.get("rule_delay_seconds", 0.0),
    )
    with OfflineStack(options) as offline:
        yield offline


def summary_of(stack: OfflineStack, run: str) -> RunSummary:
    """The run's summary.json: its failure's (reports/failures/) if it has one, else its evaluation's."""
    failed, evaluated = prefixes.summary_keys(run)
    listed = stack.aws.s3.list_objects_v2(Bucket=stack.ref("DataBucket"), Prefix=failed)
    return RunSummary.model_validate(read_json(stack, failed if listed.get("KeyCount") else evaluated))


def test_a_drop_is_trained_on_two_hosts_evaluated_and_its_model_accepted(stack: OfflineStack) -> None:
    drop_with_validation(stack, "munich-20", train=8, val=2)

    run = run_to_end(stack)

    assert run["status"] == "SUCCEEDED", run
    states = history_states(stack, run["executionArn"])
    assert states[:5] == [
        "Check that the dataset version exists",
        "Does the team want a started message?",
        "Copy the dataset to FSx",
        "Wait for the FSx import",
        "Check the FSx import",
    ]
    waits = ("Start training", "Wait for the training job to end", "Evaluate the run", "Tell the team how the run went")
    for state in waits:
        assert state in states
    assert "Wait for the profiler rules" not in states, "built-in profiling has no rule jobs to wait for"
    assert states.count("Wait for the training job to end") == 1, "the job's end event answers the one wait"
    name = run["name"]
    folder = f"reports/runs/{name}/"
    listed = stack.aws.s3.list_objects_v2(Bucket=stack.ref("DataBucket"), Prefix=folder)
    assert sorted(o["Key"].removeprefix(folder) for o in listed["Contents"]) == [
        "metrics.json",
        "report.html",
        "rules.json",
        "summary.json",
    ]
    summary = summary_of(stack, name)
    assert summary.outcome == "accepted"
    assert summary.job is not None and (summary.job.instance_count, summary.job.instance_type) == (2, "ml.m5.xlarge")
    assert summary.val_images == 2 and summary.train_images == 8
    metrics = read_json(stack, f"{folder}metrics.json")
    assert metrics["host"]["world_size"] == 2, "one process on each of two emulated hosts"
    accepted = read_json(stack, "models/accepted.json")
    assert accepted["run"] == name
    assert accepted["model_version_id"], "the accepted model is pinned by its S3 VersionId"
    packages = stack.aws.sagemaker.list_model_packages(ModelPackageGroupName="retrain-local-segmentation")
    assert len(packages["ModelPackageSummaryList"]) == 1
    assert packages["ModelPackageSummaryList"][0]["ModelApprovalStatus"] == "PendingManualApproval"


@pytest.mark.parametrize(
    "stack", [{"parameters": {"DatasetSource": "s3", "TrainingInstanceCount": "1"}}], indirect=True
)
def test_without_fsx_the_job_streams_the_dataset_from_s3_and_the_run_is_the_same(stack: OfflineStack) -> None:
    drop_with_validation(stack, "munich-s3", train=6, val=2)

    run = run_to_end(stack)

    assert run["status"] == "SUCCEEDED", run
    assert stack.aws.fsx.describe_file_systems()["FileSystems"] == [], "no file system was created"
    (job,) = job_names(stack)
    channels = stack.aws.sagemaker.describe_training_job(TrainingJobName=job)["InputDataConfig"]
    (train,) = [channel for channel in channels if channel["ChannelName"] == "train"]
    assert train["InputMode"] == "FastFile"
    assert train["DataSource"]["S3DataSource"]["S3Uri"] == f"s3://{stack.ref('DataBucket')}/dataset/"
    history = stack.aws.stepfunctions.get_execution_history(executionArn=run["executionArn"], maxResults=1000)
    outputs = [
        json.loads(details["output"])
        for event in history["events"]
        for name, details in event.items()
        if name.endswith("SucceededEventDetails") and isinstance(details, dict) and "output" in details
    ]
    assert any(isinstance(o, dict) and o.get("lifecycle") == "NOT_NEEDED" and o.get("done") for o in outputs), (
        "the sync step said there was nothing to import"
    )
    summary = summary_of(stack, run["name"])
    assert summary.outcome == "accepted"
    assert (summary.train_images, summary.val_images) == (6, 2)


def test_each_run_starts_from_the_accepted_model_and_one_made_worse_is_rejected(stack: OfflineStack) -> None:
    drop_with_validation(stack, "munich-21", train=8, val=2)
    first = run_to_end(stack)["name"]

    drop_with_validation(stack, "munich-22", train=4, val=1, skip=10)
    second = run_to_end(stack, after=1)

    assert second["status"] == "SUCCEEDED"
    summary = summary_of(stack, second["name"])
    assert summary.baseline_run == first
    assert summary.gate is not None and summary.gate.baseline_miou is not None
    metrics = read_json(stack, f"reports/runs/{second['name']}/metrics.json")
    assert metrics["init_from"], "warm-started from the accepted model"
    # The accepted model, scored by this job on this version's validation split, is the baseline.
    assert metrics["baseline"]["miou"] == summary.gate.baseline_miou
    accepted = read_json(stack, "models/accepted.json")["run"]

    # The next run forgets what it learned: random weights, and a learning rate of zero.
    stack.update_function_environment(
        "TrainingJobFunction",
        TRAINING_EXTRA_HYPERPARAMETERS=json.dumps({"workers": 0, "from-scratch": True, "lr": 0.0}),
    )
    drop_with_validation(stack, "munich-24", train=2, val=1, skip=30)
    worse = run_to_end(stack, after=2)

    assert worse["status"] == "SUCCEEDED", "a rejected model is a clear verdict, not a failed run"
    verdict = summary_of(stack, worse["name"])
    assert verdict.outcome == "rejected"
    assert verdict.gate is not None and not verdict.gate.accepted
    assert verdict.gate.miou_change is not None and verdict.gate.miou_change < 0
    assert read_json(stack, "models/accepted.json")["run"] == accepted, "the accepted model stays"


@pytest.mark.parametrize(
    "stack",
    [{"parameters": {"TrainingExtraHyperparameters": json.dumps({"workers": 0, "classes": "road,sky"})}}],
    indirect=True,
)
def test_a_training_job_that_fails_fails_the_run_with_the_trainers_error(stack: OfflineStack) -> None:
    drop_with_validation(stack, "munich-25", train=4, val=1)

    run = run_to_end(stack)

    assert run["status"] == "FAILED"
    assert "failed: AlgorithmError" in run["cause"]
    summary = summary_of(stack, run["name"])
    assert (summary.outcome, summary.failed_state) == ("failed", "Wait for the training job to end")
    assert summary.error == "TrainingJobFailedError"
    assert "Tell the team the run failed" in history_states(stack, run["executionArn"])


def test_a_failed_fsx_import_fails_the_run_before_any_training_job(stack: OfflineStack) -> None:
    assert stack.fsx is not None
    stack.fsx.fail_next_task("the file system could not read s3://bucket/dataset/ (access denied)")
    drop_with_validation(stack, "munich-26", train=2, val=1)

    run = run_to_end(stack)

    assert run["status"] == "FAILED"
    assert "ended FAILED: the file system could not read" in run["cause"]
    assert job_names(stack) == [], "no training job was created"
    states = history_states(stack, run["executionArn"])
    assert "Start training" not in states
    assert summary_of(stack, run["name"]).failed_state == "Check the FSx import"


def test_a_failure_after_the_job_started_stops_the_job(stack: OfflineStack) -> None:
    assert stack.training is not None
    # The first look at the job is refused: the role lost its permission mid-run.
    stack.training.fail_describe(
        "AccessDeniedException", "not authorized to perform: sagemaker:DescribeTrainingJob", times=1
    )
    drop_with_validation(stack, "munich-27", train=4, val=1)

    run = run_to_end(stack)

    assert run["status"] == "FAILED"
    (job,) = job_names(stack)
    described = stack.training.wait(job, timeout=120)
    assert described["TrainingJobStatus"] == "Stopped"
    stop = [e for e in stack.history(run["executionArn"]) if e["type"] == "TaskStateExited"]
    stopped = [
        json.loads(e["stateExitedEventDetails"]["output"])
        for e in stop
        if e["stateExitedEventDetails"]["name"] == "Stop the training job if one was created"
    ]
    assert stopped[0]["stop"] == {"job_name": job, "status": "InProgress", "stopped": True}


@pytest.mark.parametrize(
    "stack", [{"parameters": {"ProfilingBackend": "debugger"}, "rule_delay_seconds": 3.0}], indirect=True
)
def test_with_debugger_the_run_waits_for_rules_that_outlive_the_job(stack: OfflineStack) -> None:
    stack.update_function_environment(
        "TrainingJobFunction",
        # A rule that always finds an issue here: initialisation took longer than 0 minutes.
        TRAINING_JOB_RULES=json.dumps(
            ["ProfilerReport", {"rule": "MaxInitializationTime", "parameters": {"threshold": 0}}]
        ),
        TRAINING_JOB_CHECKPOINTING="false",
    )
    drop_with_validation(stack, "munich-28", train=4, val=1)

    run = run_to_end(stack)

    assert run["status"] == "SUCCEEDED", run
    states = history_states(stack, run["executionArn"])
    assert states.count("Check the profiler rules") >= 1, "the rules were still InProgress when the job ended"
    summary = summary_of(stack, run["name"])
    assert summary.rules_backend == "debugger"
    verdicts = {rule.name: rule.status for rule in summary.rules}
    assert verdicts["MaxInitializationTime"] == "IssuesFound"
    assert summary.artifacts.report is not None


def test_a_throttled_create_training_job_is_retried_and_trains_one_job(stack: OfflineStack) -> None:
    assert stack.training is not None
    stack.training.throttle("CreateTrainingJob", times=2)
    drop_with_validation(stack, "munich-29", train=4, val=1)

    run = run_to_end(stack)

    assert run["status"] == "SUCCEEDED", run
    assert len(job_names(stack)) == 1


def test_data_arriving_during_a_run_starts_exactly_one_follow_up(stack: OfflineStack) -> None:
    drop_with_validation(stack, "munich-30", train=4, val=1)
    drain(stack)
    wait_until(lambda: len(executions(stack)) == 1, timeout=60, message="the first run")
    for batch, skip in (("late-1", 20), ("late-2", 25)):
        drop_with_validation(stack, batch, train=1, val=0, skip=skip)
    drain(stack)

    wait_until(
        lambda: len([e for e in executions(stack) if e["status"] != "RUNNING"]) == 2, timeout=400, message="two runs"
    )

    assert len(executions(stack)) == 2, "the two late drops share one follow-up run"


@pytest.fixture
def served_stack() -> Iterator[OfflineStack]:
    """On a loopback server, as `retrain local up` runs it: presigned links are real URLs."""
    options = StackOptions(
        mode="server", parameters={**DATA, **TRAINING}, poll=False, tick=False, batching_window_seconds=0
    )
    with OfflineStack(options) as offline:
        yield offline


def test_the_team_is_told_by_email_and_slack_and_the_report_link_opens_without_credentials(
    served_stack: OfflineStack,
) -> None:
    stack = served_stack
    inbox = stack.topic_inbox()
    drop_with_validation(stack, "munich-31", train=4, val=1)

    run = run_to_end(stack)

    assert run["status"] == "SUCCEEDED", run
    (email,) = inbox.receive(wait_seconds=1)
    assert email["Subject"].startswith("Retraining accepted: mIoU")
    assert email["MessageAttributes"]["outcome"]["Value"] == "accepted"
    assert stack.slack is not None
    (posted,) = stack.slack.messages
    assert posted["text"] == email["Subject"]
    buttons = {
        b["text"]["text"]: b["url"]
        for block in posted["blocks"]
        if block["type"] == "actions"
        for b in block["elements"]
    }
    link = buttons["Profiling report"]
    assert link in email["Message"], "both channels carry the same link"
    with urllib.request.urlopen(link, timeout=10) as response:
        fetched = response.read()
    key = f"reports/runs/{run['name']}/report.html"
    assert fetched == stack.aws.s3.get_object(Bucket=stack.ref("DataBucket"), Key=key)["Body"].read()


def test_with_slack_down_the_run_succeeds_sns_is_sent_and_no_log_shows_the_webhook(
    stack: OfflineStack, capfd: pytest.CaptureFixture[str]
) -> None:
    assert stack.slack is not None
    stack.slack.misbehave(*[Misbehaviour(500, "internal_error")] * 10)
    inbox = stack.topic_inbox()
    drop_with_validation(stack, "munich-32", train=4, val=1)

    run = run_to_end(stack)

    assert run["status"] == "SUCCEEDED", run
    assert [m["Subject"][:19] for m in inbox.receive(wait_seconds=1)] == ["Retraining accepted"]
    (notify,) = [i for i in stack.runtime.invocations if i.function.endswith("NotifyFunction")]
    slack = notify.payload["slack"]
    assert (slack["delivered"], slack["skipped"], slack["status"], slack["attempts"]) == (False, None, 500, 3)
    captured = capfd.readouterr()
    history = json.dumps(stack.history(run["executionArn"]), default=str)
    for text in (captured.out, captured.err, history, json.dumps(notify.payload)):
        assert stack.slack.url not in text and "0ff1ine5ecret" not in text
