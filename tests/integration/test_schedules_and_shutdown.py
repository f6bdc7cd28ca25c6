"""Schedules fire offline, and stopping the stack leaves nothing running."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from retrain.local.stack import DEFAULT_TEMPLATE, OfflineStack, StackOptions
from retrain.local.template import load_template
from retrain.local.ticker import ScheduleError, rate_seconds
from tests.integration.conftest import FAST_QUEUE


@pytest.fixture
def scheduled_template(tmp_path: Path) -> Path:
    """The real template plus one scheduled function (the sweeper's shape, before it exists)."""
    body = load_template(DEFAULT_TEMPLATE).body
    body["Resources"]["HeartbeatFunction"] = {
        "Type": "AWS::Serverless::Function",
        "Properties": {
            "Handler": "tests.integration.handlers.show_environment",
            "Environment": {"Variables": {"POWERTOOLS_SERVICE_NAME": "heartbeat"}},
            "Events": {
                "EveryFiveMinutes": {
                    "Type": "ScheduleV2",
                    "Properties": {
                        "ScheduleExpression": "rate(5 minutes)",
                        "Input": json.dumps({"names": ["POWERTOOLS_SERVICE_NAME"]}),
                    },
                }
            },
        },
    }
    path = tmp_path / "template.yaml"
    # The loader turns short-form tags into long form; plain YAML of that reads back the same.
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    (tmp_path / "statemachine").symlink_to(DEFAULT_TEMPLATE.parent / "statemachine")
    return path


def test_rate_expressions_become_intervals_and_cron_asks_for_an_override() -> None:
    assert rate_seconds("rate(5 minutes)") == 300
    assert rate_seconds("rate(1 hour)") == 3600
    with pytest.raises(ScheduleError, match="tick-seconds"):
        rate_seconds("cron(0 3 * * ? *)")


def test_a_scheduled_function_is_invoked_by_the_ticker(scheduled_template: Path) -> None:
    options = StackOptions(
        template=scheduled_template, parameters=FAST_QUEUE, poll=False, tick_seconds=0.2
    )
    with OfflineStack(options) as stack:
        (schedule,) = stack.ticker.schedules
        assert schedule.expression == "rate(5 minutes)"
        deadline = time.monotonic() + 10
        while not stack.runtime.invocations and time.monotonic() < deadline:
            time.sleep(0.05)

        heartbeat = stack.runtime.invocations[0]
        assert heartbeat.function == "retrain-local-HeartbeatFunction"
        assert heartbeat.payload == {"POWERTOOLS_SERVICE_NAME": "heartbeat"}


def test_stopping_the_stack_stops_running_executions_and_every_thread(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    stack = OfflineStack(StackOptions(parameters=FAST_QUEUE)).start()
    sfn = stack.aws.stepfunctions
    machine = sfn.create_state_machine(
        name="waits-an-hour",
        definition=json.dumps(
            {"StartAt": "Wait", "States": {"Wait": {"Type": "Wait", "Seconds": 3600, "End": True}}}
        ),
        roleArn="arn:aws:iam::123456789012:role/test",
    )["stateMachineArn"]
    execution = sfn.start_execution(stateMachineArn=machine, name="long", input="{}")
    assert sfn.describe_execution(executionArn=execution["executionArn"])["status"] == "RUNNING"

    stack.stop()

    leftover = [t for t in set(threading.enumerate()) - before if t.is_alive()]
    assert leftover == [], f"threads still running after stop: {[t.name for t in leftover]}"
    with pytest.raises(RuntimeError, match="not running"):
        _ = stack.aws
