"""`retrain local up` and `retrain local demo` as a user runs them, on a loopback server."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import boto3
import pytest
from typer.testing import CliRunner

from retrain.cli import app
from retrain.local.cloudformation.stack import OfflineStack, StackOptions
from tests.integration.conftest import FAST_QUEUE

pytestmark = pytest.mark.slow(seconds=20)  # the longest test here, on 2 cores


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


def test_make_run_plays_the_whole_loop_and_its_report_opens_from_disk_in_a_real_browser(tmp_path: Path) -> None:
    args = ["local", "demo", "--count", "30", "--size", "128x64", "--epochs", "2", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})

    output = result.output
    assert result.exit_code == 0, output
    stages = [
        "Uploading to s3://",
        "64 of 64 objects checked: 54 curated, 2 duplicate, 1 marker, 7 quarantined",
        "Not curated, and why",
        "closed (marker) and reported",
        "frozen; retraining run ds-",
        "FSx for Lustre: import task",
        "import SUCCEEDED",
        "SageMaker training job retrain-",  # retrain-<8 hex of the stack id>-<version>-<hash>
        "epoch 1/2: train loss",
        "epoch 2/2: train loss",
        "Evaluation and the quality gate",
        "label screening: no accepted model yet: nothing to screen with (every batch is trained on)",
        "the gate accepted the model",
        "Profiler rules (builtin)",
        "E-mail (SNS), subject: Retraining accepted",
        "Slack (",
        "Where to look",
        "Offline stack stopped; nothing left running.",
    ]
    positions = [output.find(stage) for stage in stages]
    assert all(p >= 0 for p in positions), [s for s, p in zip(stages, positions, strict=True) if p < 0]
    assert positions == sorted(positions), "the stages were not shown in the order they happen"
    reasons = ("mask_unknown_class", "image_truncated", "mask_size_mismatch", "unsupported_extension")
    reasons += ("duplicate_image",)
    assert all(reason in output for reason in reasons), "a broken file's reason is missing"
    assert '"_aws"' not in output and "CloudWatchMetrics" not in output, "raw EMF metric JSON reached the story"
    function_log = Path(re.search(r"Lambda logs and EMF metrics\s+(\S+)", output).group(1))  # type: ignore[union-attr]
    assert "CloudWatchMetrics" in function_log.read_text(), "the functions' metrics were not emitted to their log"

    report = Path(re.search(r"Open the report in a browser: file://(\S+)", output).group(1))  # type: ignore[union-attr]
    run_folder = report.parent
    summary = json.loads((run_folder / "summary.json").read_text())
    assert summary["outcome"] == "accepted" and (run_folder / "model" / "model.pt").stat().st_size > 0
    assert json.loads((run_folder / "slack-message.json").read_text())["blocks"]
    assert f"s3://{summary['artifacts']['report'].removeprefix('s3://')}" in output

    dom = open_in_browser(report)
    assert f"Profiling report: {summary['job']['name']}" in dom, dom[:2000]
    assert "DataStall" in dom and "<svg" in dom, "the report's rule table and charts did not render"


def open_in_browser(page: Path) -> str:
    """The page as headless Chromium renders it from disk (the DOM after parsing)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have Chromium: .ci/run installs it")
        pytest.skip("no Chromium here: apt-get install chromium")
    done = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_local_up_prints_how_to_reach_it_and_what_its_jobs_train_with_and_stops_cleanly_on_ctrl_c() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "retrain.cli", "local", "up"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "300"},
    )
    try:
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
        assert re.search(r"training jobs\s+1 x ml\.m5\.xlarge, 4 epochs, crop 128x64, width 0\.25", printed), printed
        assert "instead of a deployed stack's 1 x ml.g5.2xlarge, 100 epochs, crop 1024x512, width 1.0" in printed
        assert "a job here is torchrun on this machine's CPU, on small images" in printed

        user_s3 = boto3.client("s3", endpoint_url=endpoint.group(1), region_name="us-east-1")
        assert user_s3.head_bucket(Bucket=bucket.group(1))["ResponseMetadata"]["HTTPStatusCode"] == 200

        process.send_signal(signal.SIGINT)
        remaining, _ = process.communicate(timeout=60)

        assert process.returncode == 0, remaining
        assert "Stopped." in remaining
    finally:
        if process.poll() is None:  # failed before it stopped: never leave a stack running
            process.kill()
            process.communicate()


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
