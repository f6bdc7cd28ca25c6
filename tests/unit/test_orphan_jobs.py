"""A run that ends while "Start training" is still creating its job has that job stopped all the same.

Step Functions does not stop the Lambda function of a state it is waiting for. A run stopped (or
timed out) during "Start training" ends at once, RunEnded looks for its job and finds none yet,
and then the function creates it. So "Start training" looks at its own execution once the job
exists and stops the job of a run that has ended, and the safety poll stops every job of this
stack whose run is over (functions/training_job/orphans.py).

The functions' own logic; SageMaker is the offline stack's training emulator
(retrain/local/sagemaker), Step Functions, S3 and DynamoDB are moto. The emulator's cores are
taken, so every job waits InProgress, running nothing, until it is stopped.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from moto import mock_aws

from functions.common.models import RunContext, TrainerCode
from functions.common.requests import SweepWaits
from functions.data.ledger import Ledger
from functions.data.run_lock import Executions, execution_arn
from functions.run_ended.cleanup import JobStop, RunCleanup
from functions.training_job.builder import TrainingRun, build_training_job_request
from functions.training_job.orphans import OrphanJobs, OrphanStop
from functions.training_job.run import TrainingJobs
from functions.training_job.waiting import JobWaits
from retrain.local.cloudformation.stack import create_ledger_table
from retrain.local.endpoint.emulators import EmulatorRegistry
from retrain.local.sagemaker.training import TrainingEmulator
from tests.unit.training_job.helpers import ACCOUNT, BUCKET, SETTINGS, job_config

REGION = SETTINGS["region"]
PREFIX = "retrain-0a1b2c3d"  # this stack's: retrain-<the first 8 hex digits of its stack id>
ANOTHER_STACK = "retrain-9f8e7d6c"
VERSION = "ds-20261203-091500-4f1c2a9b"
# Never run (the cores are taken): the jobs' code only has to be there, with its sha256.
ARCHIVE = b"import time\nwhile True:\n    time.sleep(1)\n"


@dataclass
class Stack:
    emulator: TrainingEmulator
    registry: EmulatorRegistry
    sagemaker: Any
    sfn: Any
    s3: Any
    ledger: Ledger
    executions: Executions
    code: TrainerCode

    def training(self, *, looks_at_its_run: bool = True, prefix: str = PREFIX) -> TrainingJobs:
        """The training-job function's logic; `looks_at_its_run=False` plays one that died between
        its CreateTrainingJob and its look at the run (a timeout, a crash)."""
        return TrainingJobs(
            job_config(job_name_prefix=prefix),
            self.sagemaker,
            self.s3,
            BUCKET,
            self.ledger,
            self.executions if looks_at_its_run else None,
        )

    def run(self, name: str, *, started: bool = True) -> RunContext:
        """A run, past PrepareRun; `started=False`: one whose execution does not exist."""
        arn = execution_arn(self.executions.state_machine_arn, name)
        if started:
            arn = self.sfn.start_execution(stateMachineArn=self.executions.state_machine_arn, name=name)["executionArn"]
        return RunContext(
            run=name,
            execution_arn=arn,
            dataset_version=VERSION,
            manifest_uri=f"s3://{BUCKET}/dataset/manifests/{VERSION}.jsonl",
            manifest_version_id=None,
            pair_count=3,
            poll_seconds=0,
            code=self.code,
        )

    def status(self, job_name: str) -> str:
        return str(self.sagemaker.describe_training_job(TrainingJobName=job_name)["TrainingJobStatus"])

    def ended(self, job_name: str) -> str:
        return str(self.emulator.wait(job_name, timeout=60)["TrainingJobStatus"])


@contextmanager
def _stack(tmp_path: Path) -> Iterator[Stack]:
    with mock_aws():
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        archive = _archive()
        sha256 = hashlib.sha256(archive).hexdigest()
        s3.put_object(Bucket=BUCKET, Key=f"code/{sha256}/sourcedir.tar.gz", Body=archive)
        dynamodb = boto3.client("dynamodb", region_name=REGION)
        create_ledger_table(dynamodb, "ledger")
        sfn = boto3.client("stepfunctions", region_name=REGION)
        waits = {"StartAt": "Train", "States": {"Train": {"Type": "Wait", "Seconds": 86400, "End": True}}}
        machine = sfn.create_state_machine(
            name="retrain-stack-retrain",
            definition=json.dumps(waits),
            roleArn=f"arn:aws:iam::{ACCOUNT}:role/RetrainStateMachine",
        )["stateMachineArn"]
        emulator = TrainingEmulator(
            s3=s3,
            workdir=tmp_path / "jobs",
            region=REGION,
            account_id=ACCOUNT,
            resolve_file_system=lambda _id, _directory: tmp_path,
            max_processes=1,
            stop_grace_seconds=1.0,
        )
        registry = EmulatorRegistry()
        emulator.register(registry)
        registry.install()
        give_back = emulator.occupy_cores()
        try:
            yield Stack(
                emulator=emulator,
                registry=registry,
                sagemaker=boto3.client("sagemaker", region_name=REGION),
                sfn=sfn,
                s3=s3,
                ledger=Ledger(dynamodb, "ledger"),
                executions=Executions(sfn, machine),
                code=TrainerCode(uri=f"s3://{BUCKET}/code/{sha256}/sourcedir.tar.gz", sha256=sha256),
            )
        finally:
            emulator.stop_all(timeout=30)
            give_back()
            registry.uninstall()


def _archive() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = len(ARCHIVE)
        tar.addfile(info, io.BytesIO(ARCHIVE))
    return buffer.getvalue()


def test_a_run_stopped_while_start_training_creates_its_job_ends_with_the_job_stopped(tmp_path: Path) -> None:
    with _stack(tmp_path) as stack:
        run = stack.run("ds-20261203-091500-4f1c2a9b")
        assert run.execution_arn is not None
        run_ended_looked: list[JobStop] = []
        create = stack.emulator.create_training_job

        def stopped_before_the_create_returns(params: dict[str, Any]) -> dict[str, Any]:
            # An operator stops the run now; the end's clean-up (RunEnded's) runs at once and
            # finds the job's name recorded for the run, but no job yet.
            stack.sfn.stop_execution(executionArn=run.execution_arn, cause="an operator stopped it")
            cleanup = RunCleanup(
                stack.sagemaker, stack.ledger.run_job, release=lambda _run: True, message_owed=lambda _run: False
            )
            run_ended_looked.append(cleanup.stop_job(run.run))
            return create(params)

        stack.registry.register("sagemaker", "CreateTrainingJob", stopped_before_the_create_returns)

        job = stack.training().start(run)

        (looked,) = run_ended_looked
        assert (looked.job_name, looked.status, looked.stopped) == (job.job_name, None, False), (
            "the run's end looked before the job existed: it had nothing to stop"
        )
        assert (job.status, job.run_ended) == ("Stopping", "ABORTED")
        assert stack.ended(job.job_name) == "Stopped"


def test_a_run_that_still_runs_keeps_the_job_it_started(tmp_path: Path) -> None:
    with _stack(tmp_path) as stack:
        job = stack.training().start(stack.run("ds-20261203-091500-4f1c2a9b"))

        assert (job.status, job.run_ended) == ("InProgress", None)
        assert stack.status(job.job_name) == "InProgress"


def test_the_safety_poll_stops_every_job_of_this_stack_whose_run_is_over_and_no_other(tmp_path: Path) -> None:
    with _stack(tmp_path) as stack:
        runs = {
            "running": stack.run("ds-running"),
            "stopped": stack.run("ds-stopped"),
            "never started": stack.run("ds-never-started", started=False),
        }
        # Each "Start training" died between its create and its look at the run.
        jobs = {what: stack.training(looks_at_its_run=False).start(run).job_name for what, run in runs.items()}
        anothers = stack.training(looks_at_its_run=False, prefix=ANOTHER_STACK).start(stack.run("ds-theirs"))
        stack.sfn.stop_execution(executionArn=runs["stopped"].execution_arn, cause="an operator stopped it")
        poll = JobWaits(
            stack.training(), stack.ledger, stack.sfn, OrphanJobs(stack.sagemaker, stack.executions, prefix=PREFIX)
        )

        report = poll.handle(SweepWaits(action="sweep"))

        assert sorted(report.orphans, key=lambda orphan: orphan.job_name) == sorted(
            [
                OrphanStop(job_name=jobs["stopped"], execution="ds-stopped", execution_status="ABORTED", stopped=True),
                OrphanStop(
                    job_name=jobs["never started"], execution="ds-never-started", execution_status=None, stopped=True
                ),
            ],
            key=lambda orphan: orphan.job_name,
        )
        assert stack.ended(jobs["stopped"]) == stack.ended(jobs["never started"]) == "Stopped"
        assert stack.status(jobs["running"]) == "InProgress", "its run still runs"
        assert stack.status(anothers.job_name) == "InProgress", "another stack's job is not this one's to stop"
        again = poll.handle(SweepWaits(action="sweep"))
        assert again.orphans == [], "stopped jobs are not InProgress: nothing is stopped twice"


def test_a_job_of_this_stack_that_names_no_run_is_left_alone_and_reported(tmp_path: Path) -> None:
    with _stack(tmp_path) as stack:
        by_hand = build_training_job_request(
            job_config(job_name_prefix=PREFIX),
            TrainingRun(dataset_version=VERSION, code_s3_uri=stack.code.uri),  # no execution: no run tag
        )
        stack.sagemaker.create_training_job(**by_hand)

        orphans = OrphanJobs(stack.sagemaker, stack.executions, prefix=PREFIX).sweep()

        assert orphans == [
            OrphanStop(job_name=by_hand["TrainingJobName"], execution=None, execution_status=None, stopped=False)
        ]
        assert stack.status(by_hand["TrainingJobName"]) == "InProgress"
