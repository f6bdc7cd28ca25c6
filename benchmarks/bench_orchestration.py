"""Orchestration overhead: a drop's way to its run's notification, less the training job's own time.

    .venv/bin/python benchmarks/bench_orchestration.py [--pairs 12] [--runs 1]

Run from the repository root. The offline stack (mock_aws, the real functions, the real state
machine on moto's engine, the FSx emulator and the SageMaker emulator running the real trainer)
with the template's default waits (`PollSeconds`, `PollMaxSeconds`, the safety poll's schedule
is not played: the job's events are), the data parameters the tests use (a run starts on the
first closed batch) and a training job of a few seconds. One team drops a batch of synthetic
scenes and its marker; the clock starts before the first upload and stops when NotifyFunction
has told the team how the run went. Prints per run:
- `orchestration_overhead_seconds`: drop to notification, less the training job's own time
  (its CreationTime to its TrainingEndTime, as DescribeTrainingJob reports them); target: at
  most 10;
- `drop_to_run_seconds`, `run_to_job_seconds`, `job_seconds`, `job_end_to_notification_seconds`:
  where the time went (upload and intake; FSx import and the job's start; the job; the wait's
  answer, evaluation and notification).
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from functions.common.contracts import split_for
from retrain.local.cloudformation.stack import OfflineStack, StackOptions
from retrain.synth import write_scenes

# As tests/integration/conftest.py's DATA and TRAINING, without their 1-second polling: the
# template's defaults are what is measured.
PARAMETERS = {
    "FunctionTimeoutSeconds": "30",
    "IntakeVisibilityTimeoutSeconds": "30",
    "MinNewPairs": "1",
    "SettleSeconds": "0",
    "TrainingInstanceType": "ml.m5.xlarge",
    "TrainingInstanceCount": "1",
    "TrainingEpochs": "1",
    "TrainingWidth": "0.25",
    "TrainingBatchSize": "2",
    "TrainingCrop": "96x48",
    "TrainingExtraHyperparameters": '{"workers": 0}',
}
NOTIFY = "retrain-local-NotifyFunction"


def metric(name: str, value: object) -> None:
    print(f"{name}: {value}", flush=True)


def drop(stack: OfflineStack, folder: Path, batch: str, pairs: int, seed: int) -> None:
    """`pairs` scenes with at least one in the validation split (a run needs one), then the marker."""
    count = pairs
    while True:
        written = write_scenes(folder / batch, count=count, size=(96, 48), seed=seed, batch=batch)
        hashes = [hashlib.sha256(image.read_bytes()).hexdigest() for image, _ in written]
        if any(split_for(digest, 0.1) == "val" for digest in hashes):
            break
        count += 1
    bucket = stack.ref("DataBucket")
    for image, label in written:
        stack.aws.s3.put_object(Bucket=bucket, Key=f"incoming/{batch}/images/{image.name}", Body=image.read_bytes())
        stack.aws.s3.put_object(Bucket=bucket, Key=f"incoming/{batch}/labels/{label.name}", Body=label.read_bytes())
    stack.aws.s3.put_object(Bucket=bucket, Key=f"incoming/{batch}/_COMPLETE", Body=b"")


def one_run(pairs: int, seed: int) -> dict[str, float]:
    options = StackOptions(parameters=PARAMETERS, tick=False, batching_window_seconds=0)
    with OfflineStack(options) as stack, tempfile.TemporaryDirectory() as folder:
        started = time.time()
        drop(stack, Path(folder), f"bench-{seed}", pairs, seed)
        sfn = stack.aws.stepfunctions
        (machine,) = [m for m in sfn.list_state_machines()["stateMachines"] if m["name"].endswith("-retrain")]
        deadline = time.monotonic() + 600
        executions: list[dict[str, Any]] = []
        while not executions and time.monotonic() < deadline:
            executions = sfn.list_executions(stateMachineArn=machine["stateMachineArn"])["executions"]
            time.sleep(0.05)
        if not executions:
            raise SystemExit("no run started within 10 minutes")
        ended = stack.wait_for_execution(executions[0]["executionArn"], timeout=600)
        if ended["status"] != "SUCCEEDED":
            raise SystemExit(f"the run ended {ended['status']}: {ended.get('error')} {ended.get('cause')}")
        told = [i for i in stack.runtime.invocations if i.function == NOTIFY and not i.failed]
        notified = max(i.ended_at for i in told)
        (summary,) = stack.aws.sagemaker.list_training_jobs()["TrainingJobSummaries"]
        job = stack.aws.sagemaker.describe_training_job(TrainingJobName=summary["TrainingJobName"])
        created, job_ended = _epoch(job["CreationTime"]), _epoch(job["TrainingEndTime"])
        run_started = _epoch(ended["startDate"])
    return {
        "orchestration_overhead_seconds": (notified - started) - (job_ended - created),
        "drop_to_run_seconds": run_started - started,
        "run_to_job_seconds": created - run_started,
        "job_seconds": job_ended - created,
        "job_end_to_notification_seconds": notified - job_ended,
    }


def _epoch(moment: datetime) -> float:
    return moment.timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=12, help="scenes in the drop (at least one lands in val)")
    parser.add_argument("--runs", type=int, default=1, help="drops, each on a fresh stack")
    args = parser.parse_args()
    print("# bench_orchestration: .venv/bin/python benchmarks/bench_orchestration.py", flush=True)
    for run in range(args.runs):
        for name, value in one_run(args.pairs, seed=run).items():
            metric(name, f"{value:.2f}")


if __name__ == "__main__":
    main()
