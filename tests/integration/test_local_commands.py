"""`retrain local up` and `retrain local demo` as a user runs them, on a loopback server."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import boto3
import pytest
from typer.testing import CliRunner

from retrain.cli import app
from retrain.local.stack import OfflineStack, StackOptions
from tests.integration.conftest import FAST_QUEUE

pytestmark = pytest.mark.slow


def test_the_server_stack_takes_uploads_from_any_aws_client_and_frees_its_port() -> None:
    with OfflineStack(StackOptions(mode="server", parameters=FAST_QUEUE, batching_window_seconds=0)) as stack:
        assert stack.endpoint_url is not None
        endpoint = stack.endpoint_url
        user_s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        user_s3.put_object(Bucket=stack.ref("DataBucket"), Key="incoming/by-hand/images/x.jpg", Body=b"jpeg")
        table = stack.ref("LedgerTable")
        deadline = time.monotonic() + 20
        files: list[object] = []
        while not files and time.monotonic() < deadline:
            items = stack.aws.dynamodb.scan(TableName=table)["Items"]
            files = [item for item in items if item["sk"]["S"].startswith("file#")]
            time.sleep(0.1)
        assert len(files) == 1

    host, port = endpoint.removeprefix("http://").split(":")
    with pytest.raises(ConnectionRefusedError), socket.create_connection((host, int(port)), 1):
        pass


def test_the_demo_drops_a_synthetic_batch_and_accounts_for_every_object() -> None:
    result = CliRunner().invoke(app, ["local", "demo", "--count", "24", "--size", "128x64"])

    assert result.exit_code == 0, result.output
    assert result.output.count(" curated ") == 46, result.output  # the 23 good pairs
    assert result.output.count(" quarantined ") == 3, result.output  # broken pair, stray file
    assert "Dataset version ds-" in result.output and ": 23 pairs" in result.output
    assert "Retraining run ds-" in result.output and "SUCCEEDED" in result.output
    assert "Outcome: accepted" in result.output, "the first model that learned is accepted"
    assert "Notification (SNS e-mail): Retraining accepted" in result.output
    assert "Notification (Slack," in result.output, "the Slack message the loopback webhook received"
    assert "nothing left running" in result.output


def test_local_up_prints_how_to_reach_it_and_stops_cleanly_on_ctrl_c() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "retrain.cli", "local", "up"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        lines.append(line)
        if "Press Ctrl-C" in line or not line:
            break
    printed = "".join(lines)
    endpoint = re.search(r"AWS endpoint\s+(http://127\.0\.0\.1:\d+)", printed)
    bucket = re.search(r"data bucket\s+s3://(\S+)", printed)
    assert endpoint and bucket, printed
    assert f"aws --endpoint-url {endpoint.group(1)} s3 cp" in printed
    assert re.search(r"state machine\s+arn:aws:states:", printed)

    user_s3 = boto3.client("s3", endpoint_url=endpoint.group(1), region_name="us-east-1")
    assert user_s3.head_bucket(Bucket=bucket.group(1))["ResponseMetadata"]["HTTPStatusCode"] == 200

    process.send_signal(signal.SIGINT)
    remaining, _ = process.communicate(timeout=60)

    assert process.returncode == 0, remaining
    assert "Stopped." in remaining


def test_retrain_link_prints_a_fresh_link_that_opens_the_report_without_credentials() -> None:
    with OfflineStack(StackOptions(mode="server", poll=False, tick=False)) as stack:
        assert stack.endpoint_url is not None
        key = "reports/runs/ds-20261203-091500-4f1c2a9b/report.html"
        stack.aws.s3.put_object(Bucket=stack.ref("DataBucket"), Key=key, Body=b"<html>the report</html>")
        runner = CliRunner()

        result = runner.invoke(
            app, ["link", "ds-20261203-091500-4f1c2a9b", "--endpoint-url", stack.endpoint_url, "--expires", "600"]
        )
        missing = runner.invoke(app, ["link", "ds-no-such-run", "--endpoint-url", stack.endpoint_url])

        assert result.exit_code == 0, result.output
        url = result.stdout.strip().splitlines()[0]
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.read() == b"<html>the report</html>"
        assert "works until" in result.output and "600 s" in result.output
        assert missing.exit_code == 2 and "has no report.html" in missing.output
