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

pytestmark = pytest.mark.slow(seconds=110)  # `make run` as it is, the longest test here, on 2 cores


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


def test_make_run_plays_two_drops_and_shows_the_screen_leaving_out_the_wrong_pairs_with_their_pictures(
    tmp_path: Path,
) -> None:
    # `make run` as a newcomer runs it: its defaults, only the output folder chosen; and --json,
    # so the story goes to stderr and how it ended to stdout (without it the same story is on
    # stdout: tests/unit/test_local_demo_command.py). `output` holds both, as a terminal shows them.
    result = CliRunner().invoke(app, ["local", "demo", "--out", str(tmp_path), "--json"], env={"COLUMNS": "200"})

    output = result.output
    assert result.exit_code == 0, output
    stages = [
        "Team munich's first drop: the first model",
        "Uploading to s3://",
        "404 of 404 objects checked: 394 curated, 2 duplicate, 1 marker, 7 quarantined",
        "Not curated, and why",
        "closed (marker) and reported",
        "frozen; retraining run ds-",
        "FSx for Lustre: import task",
        "import SUCCEEDED",
        "SageMaker training job retrain-",  # retrain-<8 hex of the stack id>-<version>-<hash>
        "epoch 1/8: train loss",
        "epoch 8/8: train loss",
        "label screening: no accepted model yet: nothing to screen with (every batch is trained on)",
        "the gate accepted the model",
        "Profiler rules (builtin)",
        "E-mail (SNS), subject: Retraining accepted",
        "Team berlin's drop: part of it exported with the wrong class map",
        "81 of 81 objects checked: 80 curated, 1 marker",
        "40 pairs accepted",
        "2 epochs from the accepted model",
        "epoch 2/2: train loss",
        "label screening (provisional): every new pair judged; 0 batch(es) held, 6 pair(s) left out",
        "6 pairs left out for berlin to fix",
        "Slack (",
        "Where to look",
        "pictures of the pairs to fix",
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

    # The screen left out exactly the pairs exported with the wrong class map, and pictured them.
    wrong = re.search(r"only a model can see it: ([\w, -]+)", output).group(1).split(", ")  # type: ignore[union-attr]
    berlin = re.search(r"(berlin-\d{8}-\d{6}) relabel list\s+(\S+)", output)
    assert berlin is not None, output
    relabel = Path(berlin.group(2)).read_text()
    to_fix = relabel.split("## Pairs to fix, worst first", 1)[1].split("\n## ", 1)[0]
    listed = list(dict.fromkeys(re.findall(r"(s\d-\d{5})", to_fix)))  # each line names its pair twice
    assert set(listed[: len(wrong)]) == set(wrong), (wrong, listed)
    pictures = sorted((Path(berlin.group(2)).parent / "fix").glob("*.png"))
    assert pictures and all(p.read_bytes().startswith(b"\x89PNG") for p in pictures)

    report = Path(re.search(r"Open the report in a browser: file://(\S+)", output).group(1))  # type: ignore[union-attr]
    run_folder = report.parent
    summary = json.loads((run_folder / "summary.json").read_text())
    # The second run's gate decides on 26 validation pairs after a 2-epoch fine-tune: either way.
    assert summary["outcome"] in {"accepted", "rejected"} and summary["gate"] is not None, summary
    if summary["outcome"] == "accepted":
        assert (run_folder / "model" / "model.pt").stat().st_size > 0
    assert json.loads((run_folder / "slack-message.json").read_text())["blocks"]
    assert f"s3://{summary['artifacts']['report'].removeprefix('s3://')}" in output

    ended = json.loads(result.stdout)
    assert (ended["ok"], ended["problems"], ended["run"]) == (True, [], run_folder.name), ended
    assert ended["first_run"] and ended["first_run"] != ended["run"], ended
    assert ended["batches"][1] == berlin.group(1) and ended["batches"][0].startswith("munich-"), ended
    assert (ended["local_folder"], ended["report"]) == (str(run_folder), str(report))
    assert ended["function_log"] == str(function_log)
    assert (ended["summary"]["run"], ended["summary"]["outcome"]) == (summary["run"], summary["outcome"])
    places = {place["what"]: place for place in ended["places"]}
    assert places["profiling report"]["path"] == str(report), places
    assert places[f"{berlin.group(1)} relabel list"]["path"] == berlin.group(2), places
    assert all(Path(place["path"]).exists() for place in ended["places"]), places

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
