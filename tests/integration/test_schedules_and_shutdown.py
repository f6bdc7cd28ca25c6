"""Schedules fire offline, and stopping the stack leaves nothing running."""

from __future__ import annotations

import json
import threading
import time

import pytest

from retrain.local.cloudformation.stack import OfflineStack, StackOptions
from retrain.local.lambda_runtime.ticker import ScheduleError, rate_seconds
from tests.integration.conftest import FAST_QUEUE


def test_rate_expressions_become_intervals_and_cron_asks_for_an_override() -> None:
    assert rate_seconds("rate(5 minutes)") == 300
    assert rate_seconds("rate(1 hour)") == 3600
    with pytest.raises(ScheduleError, match="tick-seconds"):
        rate_seconds("cron(0 3 * * ? *)")


def test_the_template_schedules_are_played_by_the_ticker() -> None:
    options = StackOptions(parameters=FAST_QUEUE, poll=False, tick_seconds=0.2)
    with OfflineStack(options) as stack:
        expressions = {s.function: s.expression for s in stack.ticker.schedules}
        assert expressions == {
            "retrain-local-SweeperFunction": "rate(5 minutes)",
            "retrain-local-TriggerFunction": "rate(15 minutes)",
            "retrain-local-TrainingJobFunction": "rate(5 minutes)",  # the safety poll of job waits
        }
        deadline = time.monotonic() + 10
        while len({i.function for i in stack.runtime.invocations}) < 3:
            assert time.monotonic() < deadline, "the ticker did not fire every schedule"
            time.sleep(0.05)

        sweep = next(i for i in stack.runtime.invocations if "Sweeper" in i.function)
        assert not sweep.failed, sweep.payload
        assert sweep.payload == {"closed": [], "incomplete": 0, "reported": []}


def test_stopping_the_stack_stops_running_executions_and_every_thread() -> None:
    before = set(threading.enumerate())
    stack = OfflineStack(StackOptions(parameters=FAST_QUEUE)).start()
    sfn = stack.aws.stepfunctions
    machine = sfn.create_state_machine(
        name="waits-an-hour",
        definition=json.dumps({"StartAt": "Wait", "States": {"Wait": {"Type": "Wait", "Seconds": 3600, "End": True}}}),
        roleArn="arn:aws:iam::123456789012:role/test",
    )["stateMachineArn"]
    execution = sfn.start_execution(stateMachineArn=machine, name="long", input="{}")
    assert sfn.describe_execution(executionArn=execution["executionArn"])["status"] == "RUNNING"

    stack.stop()

    leftover = [t for t in set(threading.enumerate()) - before if t.is_alive()]
    assert leftover == [], f"threads still running after stop: {[t.name for t in leftover]}"
    with pytest.raises(RuntimeError, match="not running"):
        _ = stack.aws
