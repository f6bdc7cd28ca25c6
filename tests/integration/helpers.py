"""What tests do to the offline stack: add functions and machines, read what the team was told."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from retrain.local.lambdas import FunctionSpec
from retrain.local.resources import substitute_definition
from retrain.local.stack import OfflineStack

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


class TopicInbox:
    """An SQS queue subscribed to a topic: what SNS really delivered, in order."""

    def __init__(self, stack: OfflineStack, topic_arn: str) -> None:
        self._sqs = stack.aws.sqs
        self._url = self._sqs.create_queue(QueueName="test-topic-inbox")["QueueUrl"]
        queue_arn = self._sqs.get_queue_attributes(QueueUrl=self._url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        stack.aws.sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=queue_arn)

    def messages(self) -> list[dict[str, Any]]:
        received = self._sqs.receive_message(QueueUrl=self._url, MaxNumberOfMessages=10).get("Messages", [])
        return [json.loads(message["Body"]) for message in received]


def queue_depth(stack: OfflineStack, logical_id: str) -> int:
    attributes = stack.aws.sqs.get_queue_attributes(
        QueueUrl=stack.ref(logical_id),
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])
