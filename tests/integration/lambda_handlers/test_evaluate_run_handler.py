"""EvaluateRun, called after a real (tiny) training job completed on the emulated SageMaker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from retrain.local.cloudformation.stack import OfflineStack
from retrain.synth import write_scenes
from tests.conftest import load_event
from tests.integration.runs import released_code

VERSION = "ds-20261203-091500-4f1c2a9b"


def _curated_version(stack: OfflineStack, folder: Path) -> None:
    """A frozen dataset version in the curated zone, as the trigger leaves one."""
    write_scenes(folder, count=8, size=(96, 48), seed=3, val_fraction=0.3, version=VERSION)
    for path in folder.rglob("*"):
        if path.is_file():
            key = f"dataset/{path.relative_to(folder).as_posix()}"
            stack.aws.s3.put_object(Bucket=stack.ref("DataBucket"), Key=key, Body=path.read_bytes())


@pytest.mark.slow(seconds=10)
def test_a_completed_job_is_published_judged_and_its_model_accepted(
    deployed: OfflineStack, handler: Any, tmp_path: Path
) -> None:
    _curated_version(deployed, tmp_path)
    run = {**load_event("run_context.json"), "code": released_code(deployed)}
    sync = handler("DatasetSyncFunction")({"action": "start", "run": run})
    assert deployed.fsx is not None and deployed.training is not None
    deployed.fsx.wait(sync["task_id"])
    job = handler("TrainingJobFunction")({"action": "start", "run": run})
    assert deployed.training.wait(job["job_name"], timeout=240)["TrainingJobStatus"] == "Completed"

    evaluation = handler("EvaluateRunFunction")({"run": run, "job": job})

    assert evaluation["outcome"] == "accepted"
    bucket = deployed.ref("DataBucket")
    assert evaluation["summary_uri"] == f"s3://{bucket}/reports/runs/{VERSION}/summary.json"
    summary = json.loads(
        deployed.aws.s3.get_object(Bucket=bucket, Key=f"reports/runs/{VERSION}/summary.json")["Body"].read()
    )
    assert summary["gate"]["accepted"] and summary["rules_backend"] == "builtin"
    assert summary["artifacts"]["weights"] == f"s3://{bucket}/models/runs/{VERSION}/model.pt"
    accepted = json.loads(deployed.aws.s3.get_object(Bucket=bucket, Key="models/accepted.json")["Body"].read())
    assert accepted["run"] == VERSION and accepted["model_package_arn"] == evaluation["model_package_arn"]

    again = handler("EvaluateRunFunction")({"run": run, "job": job})

    assert again["model_package_arn"] == evaluation["model_package_arn"], "a retry registers no second model"
