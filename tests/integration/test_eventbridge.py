"""EventBridge on the offline stack: what AWS services put on the default bus reaches the functions
whose rules match it, as EventBridge delivers it to a Lambda target (asynchronously, the whole
event), so the deployed stack and the offline one take the same path.

The stack here is a small template of its own: a bucket for a stand-in trainer, and two functions
that answer with whatever event they get (`eventbridge_handlers.record`), one with a rule for
training jobs that ended, one with a rule for executions that ended. A training job runs a
`train.py` that ends at once, so no test here trains.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from retrain.local.cloudformation.stack import ACCOUNT_ID, OfflineStack, StackOptions
from retrain.local.cloudformation.template import TemplateError
from retrain.local.events.eventbridge import EXECUTION_STATUS_CHANGE, Event
from retrain.local.sagemaker.training import STATE_CHANGE
from tests.integration.helpers import create_machine

REGION = "us-east-1"
TEMPLATE = """
AWSTemplateFormatVersion: "2010-09-09"
Transform: AWS::Serverless-2016-10-31
Resources:
  CodeBucket:
    Type: AWS::S3::Bucket
  JobWatcher:
    Type: AWS::Serverless::Function
    Properties:
      Handler: tests.integration.eventbridge_handlers.record
      Timeout: 10
      Events:
        JobEnded:
          Type: EventBridgeRule
          Properties:
            Pattern:
              source: [aws.sagemaker]
              detail-type: [SageMaker Training Job State Change]
              detail:
                TrainingJobStatus: [Completed, Failed, Stopped]
  RunWatcher:
    Type: AWS::Serverless::Function
    Properties:
      Handler: tests.integration.eventbridge_handlers.record
      Timeout: 10
      Events:
        RunEnded:
          Type: EventBridgeRule
          Properties:
            RuleName: !Sub "${AWS::StackName}-run-ended"
            Pattern:
              source: [aws.states]
              detail-type: [Step Functions Execution Status Change]
              detail:
                status: [SUCCEEDED, FAILED, TIMED_OUT, ABORTED]
"""
ENVELOPE = {"version", "id", "detail-type", "source", "account", "time", "region", "resources", "detail"}
ISO_SECONDS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")

# Stand-ins for the trainer: one that ends well, one that fails, one that runs until stopped.
ENDS_WELL = 'import os, pathlib\npathlib.Path(os.environ["SM_MODEL_DIR"], "model.txt").write_text("done")\n'
FAILS = (
    'import os, pathlib, sys\npathlib.Path(os.environ["SM_OUTPUT_DIR"], "failure").write_text("no data")\nsys.exit(3)\n'
)
RUNS_ON = "import time\nwhile True:\n    time.sleep(0.1)\n"


def write_template(folder: Path, text: str) -> Path:
    path = folder / "template.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[OfflineStack]:
    options = StackOptions(
        template=write_template(tmp_path, TEMPLATE),
        stack_name="events",
        poll=False,
        tick=False,
        upload_trainer=False,
        slack=False,
        workdir=tmp_path / "work",
    )
    with OfflineStack(options) as offline:
        yield offline


def received(stack: OfflineStack, logical_id: str) -> list[Event]:
    """The events a function was invoked with, in the order its invocations ended."""
    name = stack.ref(logical_id)
    return [invocation.payload for invocation in stack.runtime.invocations if invocation.function == name]


def until(condition: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def start_job(stack: OfflineStack, name: str, script: str) -> str:
    """A training job whose `train.py` is `script`; its ARN."""
    bucket = stack.ref("CodeBucket")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = len(script.encode())
        tar.addfile(info, io.BytesIO(script.encode()))
    stack.aws.s3.put_object(Bucket=bucket, Key=f"code/{name}.tar.gz", Body=archive.getvalue())
    return stack.aws.sagemaker.create_training_job(
        TrainingJobName=name,
        AlgorithmSpecification={
            "TrainingImage": f"{ACCOUNT_ID}.dkr.ecr.{REGION}.amazonaws.com/retrain:latest",
            "TrainingInputMode": "File",
        },
        RoleArn=f"arn:aws:iam::{ACCOUNT_ID}:role/training",
        HyperParameters={
            "sagemaker_submit_directory": json.dumps(f"s3://{bucket}/code/{name}.tar.gz"),
            "sagemaker_program": json.dumps("train.py"),
        },
        OutputDataConfig={"S3OutputPath": f"s3://{bucket}/training/"},
        ResourceConfig={"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        StoppingCondition={"MaxRuntimeInSeconds": 600},
        Tags=[{"Key": "run", "Value": name}],
    )["TrainingJobArn"]


def job_events(stack: OfflineStack, name: str) -> list[Event]:
    return [event for event in stack.eventbridge.events_of(STATE_CHANGE) if event["detail"]["TrainingJobName"] == name]


def statuses(events: list[Event]) -> list[str]:
    return [event["detail"]["TrainingJobStatus"] for event in events]


def ended(stack: OfflineStack, name: str) -> list[Event]:
    """The job's events, once the last of them is its end."""

    def if_ended() -> list[Event] | None:
        events = job_events(stack, name)
        return events if statuses(events)[-1:] in (["Completed"], ["Failed"], ["Stopped"]) else None

    return until(if_ended, f"{name} to end")  # type: ignore[no-any-return]


# ---------------------------------------------------------------- rules and delivery --
def test_a_rule_declared_in_the_template_is_in_eventbridge_and_its_function_gets_what_matches(
    stack: OfflineStack,
) -> None:
    listed = {rule["Name"]: rule for rule in stack.aws.events.list_rules()["Rules"]}
    assert set(listed) == {f"{stack.ref('JobWatcher')}-JobEnded", "events-run-ended"}
    pattern = json.loads(listed["events-run-ended"]["EventPattern"])
    assert pattern["detail"]["status"] == ["SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"]
    [target] = stack.aws.events.list_targets_by_rule(Rule="events-run-ended")["Targets"]
    assert target["Arn"] == f"arn:aws:lambda:{REGION}:{ACCOUNT_ID}:function:{stack.ref('RunWatcher')}"

    arn = f"arn:aws:sagemaker:{REGION}:{ACCOUNT_ID}:training-job/job-1"
    bus = stack.eventbridge
    bus.emit("aws.sagemaker", STATE_CHANGE, {"TrainingJobName": "job-1", "TrainingJobStatus": "InProgress"}, [arn])
    sent = bus.emit(
        "aws.sagemaker", STATE_CHANGE, {"TrainingJobName": "job-1", "TrainingJobStatus": "Completed"}, [arn]
    )

    [event] = until(lambda: received(stack, "JobWatcher"), "the Completed event to arrive")
    assert event == sent, "the function gets the whole event, as EventBridge sends it"
    assert set(event) == ENVELOPE
    assert (event["version"], event["source"], event["detail-type"]) == ("0", "aws.sagemaker", STATE_CHANGE)
    assert (event["account"], event["region"], event["resources"]) == (ACCOUNT_ID, REGION, [arn])
    assert ISO_SECONDS.match(event["time"]), event["time"]
    assert [(d.rule, d.accepted) for d in bus.deliveries] == [(f"{stack.ref('JobWatcher')}-JobEnded", True)]
    assert received(stack, "RunWatcher") == [], "a rule for another source matches nothing here"


def test_put_events_from_any_client_is_delivered_as_a_service_event_is(stack: OfflineStack) -> None:
    answer = stack.aws.events.put_events(
        Entries=[
            {
                "Source": "aws.sagemaker",
                "DetailType": STATE_CHANGE,
                "Detail": json.dumps({"TrainingJobName": "job-2", "TrainingJobStatus": "Failed"}),
            },
            {"Source": "aws.sagemaker", "DetailType": STATE_CHANGE, "Detail": "[1, 2]"},
        ]
    )

    assert answer["FailedEntryCount"] == 1
    assert answer["Entries"][1]["ErrorCode"] == "MalformedDetail", "Detail must be a JSON object"
    [event] = until(lambda: received(stack, "JobWatcher"), "the event to arrive")
    assert event["id"] == answer["Entries"][0]["EventId"]
    assert event["detail"] == {"TrainingJobName": "job-2", "TrainingJobStatus": "Failed"}


def test_a_rule_that_reshapes_the_event_is_refused_with_its_name(tmp_path: Path) -> None:
    template = TEMPLATE.replace(
        "            RuleName: !Sub", '            InputPath: "$.detail"\n            RuleName: !Sub'
    )
    options = StackOptions(template=write_template(tmp_path, template), upload_trainer=False, slack=False)

    with pytest.raises(TemplateError, match=r"RunWatcher.Events.RunEnded sets InputPath"):
        OfflineStack(options).start()


# -------------------------------------------------------------------- SageMaker --
def test_a_training_job_announces_in_progress_then_completed_and_the_rule_takes_the_end(
    stack: OfflineStack,
) -> None:
    arn = start_job(stack, "ends-well", ENDS_WELL)

    events = ended(stack, "ends-well")

    assert statuses(events) == ["InProgress", "Completed"]
    first, last = events
    assert first["source"] == "aws.sagemaker" and first["resources"] == [arn]
    assert first["detail"]["TrainingJobArn"] == arn and first["detail"]["SecondaryStatus"] == "Starting"
    assert isinstance(first["detail"]["CreationTime"], int), "times are epoch milliseconds"
    assert "TrainingEndTime" not in first["detail"]
    detail = last["detail"]
    assert detail["SecondaryStatus"] == "Completed" and "FailureReason" not in detail
    assert detail["CreationTime"] <= detail["TrainingStartTime"] <= detail["TrainingEndTime"]
    assert detail["TrainingEndTime"] == int(
        stack.aws.sagemaker.describe_training_job(TrainingJobName="ends-well")["TrainingEndTime"].timestamp() * 1000
    )
    assert [t["Status"] for t in detail["SecondaryStatusTransitions"]][-1] == "Completed"
    assert detail["Tags"] == {"run": "ends-well"}
    [delivered] = until(lambda: received(stack, "JobWatcher"), "the end to reach the rule's function")
    assert delivered == last


def test_a_failed_job_says_why_and_a_stopped_one_says_stopping_first(stack: OfflineStack) -> None:
    start_job(stack, "fails", FAILS)
    start_job(stack, "runs-on", RUNS_ON)
    until(
        lambda: stack.aws.sagemaker.describe_training_job(TrainingJobName="runs-on")["SecondaryStatus"] == "Training",
        "runs-on to train",
    )
    stack.aws.sagemaker.stop_training_job(TrainingJobName="runs-on")

    failed = ended(stack, "fails")
    stopped = ended(stack, "runs-on")

    assert statuses(failed) == ["InProgress", "Failed"]
    assert "no data" in failed[-1]["detail"]["FailureReason"]
    assert statuses(stopped) == ["InProgress", "Stopping", "Stopped"]
    until(lambda: len(received(stack, "JobWatcher")) == 2, "both ends to reach the rule's function")
    assert sorted(statuses(received(stack, "JobWatcher"))) == ["Failed", "Stopped"]


def test_a_lost_event_reaches_nobody(stack: OfflineStack) -> None:
    bus = stack.eventbridge
    bus.lose(lambda event: event["detail-type"] == STATE_CHANGE and event["detail"]["TrainingJobStatus"] == "Completed")

    start_job(stack, "unheard", ENDS_WELL)
    events = ended(stack, "unheard")

    assert statuses(events) == ["InProgress", "Completed"], "SageMaker sent it"
    assert [event["id"] for event in bus.lost] == [events[-1]["id"]]
    assert bus.deliveries == [], "nothing was handed to the rule's function"
    assert received(stack, "JobWatcher") == []
    assert stack.aws.sagemaker.describe_training_job(TrainingJobName="unheard")["TrainingJobStatus"] == "Completed"


# --------------------------------------------------------------- Step Functions --
def test_a_stopped_execution_is_announced_running_then_aborted(stack: OfflineStack) -> None:
    machine = create_machine(stack, "waits_an_hour.asl.json")
    execution = stack.aws.stepfunctions.start_execution(stateMachineArn=machine, name="held", input='{"run": 1}')
    arn = execution["executionArn"]
    bus = stack.eventbridge

    running = bus.wait_for(lambda e: e["detail-type"] == EXECUTION_STATUS_CHANGE and e["detail"]["status"] == "RUNNING")
    stack.aws.stepfunctions.stop_execution(executionArn=arn, error="Operator", cause="not this week")
    aborted = bus.wait_for(lambda e: e["detail-type"] == EXECUTION_STATUS_CHANGE and e["detail"]["status"] == "ABORTED")

    assert running["source"] == "aws.states" and running["resources"] == [arn]
    assert running["detail"]["stopDate"] is None and running["detail"]["output"] is None
    detail = aborted["detail"]
    assert (detail["executionArn"], detail["stateMachineArn"], detail["name"]) == (arn, machine, "held")
    assert detail["startDate"] <= detail["stopDate"], "epoch milliseconds"
    assert detail["input"] == '{"run": 1}' and detail["inputDetails"] == {"included": True}
    assert detail["output"] is None and detail["outputDetails"] is None
    [delivered] = until(lambda: received(stack, "RunWatcher"), "the end of the run to reach the rule's function")
    assert delivered == aborted, "the rule takes the end, not the start"


def test_without_the_watcher_executions_are_announced_when_a_test_sweeps(tmp_path: Path) -> None:
    options = StackOptions(
        template=write_template(tmp_path, TEMPLATE),
        upload_trainer=False,
        slack=False,
        poll=False,
        tick=False,
        watch_executions=False,
    )
    with OfflineStack(options) as stack:
        machine = create_machine(stack, "waits_an_hour.asl.json")
        arn = stack.aws.stepfunctions.start_execution(stateMachineArn=machine, name="quiet")["executionArn"]
        time.sleep(0.5)
        assert stack.eventbridge.events == [], "nobody looked"

        stack.eventbridge.sweep()

        assert [(e["detail"]["executionArn"], e["detail"]["status"]) for e in stack.eventbridge.events] == [
            (arn, "RUNNING")
        ]
        stack.eventbridge.sweep()
        assert len(stack.eventbridge.events) == 1, "a status is announced once"
