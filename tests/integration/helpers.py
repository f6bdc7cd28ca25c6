"""What tests do to the offline stack: add functions and machines, run them, look into a queue.

What the team was told: `OfflineStack.topic_inbox()`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from retrain.local.cloudformation.resources import substitute_definition
from retrain.local.cloudformation.stack import OfflineStack
from retrain.local.lambda_runtime.contract import FunctionSpec

MACHINES = Path(__file__).parent / "machines"


def add_test_function(stack: OfflineStack, name: str, handler: str, **environment: str) -> str:
    """Host a handler from tests/integration/handlers.py; returns its ARN."""
    spec = FunctionSpec(
        logical_id=name,
        name=name,
        handler=f"tests.integration.handlers.{handler}",
        environment=environment,
        timeout_seconds=10,
    )
    stack.runtime.add(spec)
    return stack.runtime.arn(name)


def create_machine(stack: OfflineStack, file_name: str, **substitutions: str) -> str:
    definition = substitute_definition(MACHINES / file_name, substitutions)
    return stack.aws.stepfunctions.create_state_machine(
        name=file_name.split(".", maxsplit=1)[0],
        definition=definition,
        roleArn="arn:aws:iam::123456789012:role/test-machine-role",
    )["stateMachineArn"]


def run_machine(stack: OfflineStack, machine_arn: str, name: str, payload: dict[str, Any]) -> dict[str, Any]:
    execution = stack.aws.stepfunctions.start_execution(
        stateMachineArn=machine_arn, name=name, input=json.dumps(payload)
    )
    return stack.wait_for_execution(execution["executionArn"], timeout=60)


def queue_depth(stack: OfflineStack, logical_id: str) -> int:
    attributes = stack.aws.sqs.get_queue_attributes(
        QueueUrl=stack.ref(logical_id),
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])
