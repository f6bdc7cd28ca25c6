"""Which stack a command talks to, and what it says when there is none."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import boto3
import pytest
from moto import mock_aws

from retrain import target
from retrain.local.endpoint import discovery


def record(pid: int, endpoint: str = "http://127.0.0.1:9") -> discovery.LocalStackRecord:
    return discovery.LocalStackRecord(
        stack_name="retrain-local", region="us-east-1", endpoint_url=endpoint, outputs={"A": "1"}, pid=pid
    )


def test_without_a_stack_it_says_how_to_start_one() -> None:
    with pytest.raises(target.TargetError, match=r"no offline stack is running; start one with `retrain local up`"):
        target.resolve(None)


def test_a_record_left_by_a_killed_stack_is_no_stack() -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True, text=True
    )
    discovery.publish(record(int(gone.stdout)))

    with pytest.raises(target.TargetError, match=r"\(pid \d+\) has stopped; start one"):
        target.resolve(None)


def test_a_live_record_whose_endpoint_does_not_answer_names_the_endpoint() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    discovery.publish(record(pid=os.getpid(), endpoint=f"http://127.0.0.1:{port}"))

    with pytest.raises(target.TargetError, match=rf"does not answer at http://127.0.0.1:{port}"):
        target.resolve(None)


def test_withdraw_leaves_a_newer_stacks_record() -> None:
    discovery.publish(record(pid=1))
    discovery.withdraw()  # this process is not pid 1: the record is another stack's
    assert discovery.state_path().exists()
    discovery.withdraw(pid=1)
    assert not discovery.state_path().exists()


def test_a_deployed_stack_is_read_from_its_outputs() -> None:
    template = """{
      "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
      "Outputs": {"NotificationTopicArn": {"Value": {"Ref": "Topic"}}}
    }"""
    with mock_aws():
        boto3.client("cloudformation", region_name="eu-west-1").create_stack(StackName="prod", TemplateBody=template)

        found = target.resolve("prod", region="eu-west-1")
        with pytest.raises(target.TargetError, match="there is no stack staging in eu-west-1"):
            target.resolve("staging", region="eu-west-1")

    assert found.kind == "aws" and found.endpoint_url is None
    assert found.output("NotificationTopicArn").startswith("arn:aws:sns:eu-west-1:")
    assert found.describe() == "stack prod in eu-west-1 (AWS)"
    with pytest.raises(target.TargetError, match="stack prod has no output LedgerTableName: deploy it again"):
        found.output("LedgerTableName")
