"""`retrain runs` as an engineer uses it: `retrain local up` in one terminal, the commands in another.

The stack runs in its own process, exactly as `retrain local up` starts it; this test process
talks to it only over HTTP, through what the stack recorded about itself. So `runs cancel`
reaches the emulated SageMaker through the stack's gateway, as `aws sagemaker` would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import psutil
import pytest
from typer.testing import CliRunner

from retrain.cli import app
from retrain.commands import runs as runs_command
from retrain.local.endpoint import discovery
from tests.integration.conftest import DATA, TRAINING
from tests.integration.data_drops import scene
from tests.integration.runs import seeds_for

pytestmark = pytest.mark.slow(seconds=35)  # the longest test here, on 2 cores

# Long enough (about fifteen seconds of training here) for a cancel to land while the job trains.
PARAMETERS = {**DATA, **TRAINING, "TrainingEpochs": "30"}
RUN_TIMEOUT = 240


@pytest.fixture
def local_up(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], discovery.LocalStackRecord]]:
    params = [arg for name, value in PARAMETERS.items() for arg in ("--param", f"{name}={value}")]
    log = (tmp_path / "local-up.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "retrain.cli", "local", "up", *params],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "300", "POWERTOOLS_LOG_LEVEL": "WARNING"},
    )
    try:
        deadline = time.monotonic() + 90
        found = discovery.find()
        while not isinstance(found, discovery.LocalStackRecord) and time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / "local-up.log").read_text()
            time.sleep(0.5)
            found = discovery.find()
        assert isinstance(found, discovery.LocalStackRecord), "retrain local up never recorded itself"
        yield process, found
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def runs(*args: str) -> Any:
    # A wide terminal, so the table keeps each run's name on one line. rich reads COLUMNS when a
    # console is made, which is when the module was first imported in this process, maybe by an
    # earlier test: so the width is set on the console itself.
    runs_command.console.width = 250
    return CliRunner().invoke(app, ["runs", *args], env={"COLUMNS": "250"})


def listed() -> list[dict[str, Any]]:
    result = runs("list", "--json")
    assert result.exit_code == 0, result.output
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def wait_for(condition: Any, message: str, timeout: float = RUN_TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {message}")


def trainer_processes(stack_pid: int) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(stack_pid).children(recursive=True):
        try:
            command = " ".join(child.cmdline())
            # The emulated host runs the job's entry point (train.py of sourcedir.tar.gz) under torchrun.
            if "train.py" in command or "torch.distributed.run" in command:
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def test_runs_list_show_rerun_and_cancel_against_local_up_in_another_process(
    local_up: tuple[subprocess.Popen[str], discovery.LocalStackRecord],
) -> None:
    process, record = local_up
    session = boto3.session.Session(aws_access_key_id="x", aws_secret_access_key="y", region_name=record.region)
    s3 = session.client("s3", endpoint_url=record.endpoint_url)
    bucket = record.outputs["DataBucketName"]
    for seed in seeds_for(train=6, val=2):
        pair = scene(seed)
        s3.put_object(Bucket=bucket, Key=f"incoming/bonn/images/scene-{seed}.jpg", Body=pair.image)
        s3.put_object(Bucket=bucket, Key=f"incoming/bonn/labels/scene-{seed}.png", Body=pair.label)
    s3.put_object(Bucket=bucket, Key="incoming/bonn/_COMPLETE", Body=b"")

    first = wait_for(lambda: [r for r in listed() if r["outcome"]], "the first run to end")[0]
    assert first["outcome"] == "accepted" and first["status"] == "SUCCEEDED", first
    assert first["dataset_version"] == first["run"] and first["miou"] is not None
    table = runs("list")
    assert table.exit_code == 0 and first["run"] in table.stdout and "accepted" in table.stdout, table.output
    assert f"using the offline stack retrain-local at {record.endpoint_url}" in table.stderr

    shown = runs("show", first["run"])
    assert shown.exit_code == 0, shown.output
    assert "Retraining accepted" in shown.stdout and f"dataset version  {first['run']}" in shown.stdout
    assert "Profiling report" in shown.stdout
    assert f"retrain link {first['run']}" in shown.stdout
    missing = runs("show", "ds-no-such-run")
    assert missing.exit_code == 2 and "there is no run ds-no-such-run" in missing.stderr, missing.output

    again = runs("rerun", first["run"])
    assert again.exit_code == 0, again.output
    rerun = again.stdout.split("Started run ")[1].split(" ")[0]
    assert rerun.startswith(f"{first['run']}-rerun-"), again.stdout
    refused = runs("rerun", first["run"], "--json")
    assert refused.exit_code == 1 and f"a run holds the lock: {rerun}" in refused.stderr, refused.output
    assert json.loads(refused.stdout) == {"started": None, "reason": f"a run holds the lock: {rerun}"}

    # Cancel while the job trains: its processes are there, then they are not.
    def training() -> bool:
        details = json.loads(runs("show", rerun, "--json").stdout)
        return bool(details["job_name"]) and bool(trainer_processes(process.pid))

    wait_for(training, "the rerun's job to train", timeout=120)
    cancelled = runs("cancel", rerun, "--json")
    assert cancelled.exit_code == 0, cancelled.output
    # The progress on stderr, the outcome alone on stdout.
    assert "stopped the execution" in cancelled.stderr and "released the lock" in cancelled.stderr
    assert "told the team: Retraining stopped" in cancelled.stderr, cancelled.stderr
    outcome = json.loads(cancelled.stdout)
    assert outcome["run"] == rerun and outcome["cleaned_up_by"] == "RunEndedFunction", outcome
    assert outcome["job_status"] == "Stopped", outcome
    assert not trainer_processes(process.pid), "the job's processes outlived the cancel"

    sagemaker = session.client("sagemaker", endpoint_url=record.endpoint_url)
    job = json.loads(runs("show", rerun, "--json").stdout)
    assert sagemaker.describe_training_job(TrainingJobName=job["job_name"])["TrainingJobStatus"] == "Stopped"
    assert job["status"] == "ABORTED" and job["summary"]["outcome"] == "stopped"
    assert "cancelled by" in job["summary"]["cause"]
    dynamodb = session.client("dynamodb", endpoint_url=record.endpoint_url)
    lock = dynamodb.get_item(
        TableName=record.outputs["LedgerTableName"], Key={"pk": {"S": "lock#retrain"}, "sk": {"S": "lock"}}
    )
    assert "Item" not in lock, f"the lock is still held: {lock.get('Item')}"
    rows = {row["run"]: row for row in listed()}
    assert rows[rerun]["outcome"] == "stopped" and rows[first["run"]]["outcome"] == "accepted"
    ended = runs("cancel", rerun)
    assert ended.exit_code == 1 and "already ended (ABORTED)" in ended.stderr, ended.output

    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)
    assert discovery.find() is None, "the stack left its record behind"
    gone = runs("list")
    assert gone.exit_code == 2 and "retrain local up" in gone.stderr, gone.output
