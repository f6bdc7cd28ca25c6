"""StartTraining, its look at the job, and the failure branch's stop, called directly."""

from __future__ import annotations

import re
from typing import Any

import pytest

from functions.common.errors import InvalidEventError
from retrain.local.cloudformation.stack import OfflineStack
from tests.conftest import load_event
from tests.integration.runs import released_code


def test_a_run_starts_one_job_that_a_retry_finds_and_the_failure_branch_stops(
    deployed: OfflineStack, handler: Any
) -> None:
    training = handler("TrainingJobFunction")
    run = {**load_event("run_context.json"), "code": released_code(deployed)}

    job = training({"action": "start", "run": run})
    retried = training({"action": "start", "run": run})
    looked = training({"action": "check", "run": run, "job": job})
    stopped = training({"action": "stop", "state": {"run": run}})

    # retrain-<8 hex of this stack's id>: the state machine may touch only this stack's jobs.
    (spec,) = [spec for spec in deployed.created.functions if spec.logical_id == "TrainingJobFunction"]
    prefix = spec.environment["TRAINING_JOB_JOB_NAME_PREFIX"]
    assert re.fullmatch(r"retrain-[0-9a-f]{8}", prefix)
    assert job["job_name"].startswith(f"{prefix}-ds-20261203-091500-4f1c2a9b-")
    assert retried["job_name"] == job["job_name"] and retried["already_existed"] is True
    assert looked["phase"] == "training" and looked["checks"] == 1
    assert stopped == {"job_name": job["job_name"], "status": "InProgress", "stopped": True}, (
        "found by the name it derives from the execution, though the state had no $.job"
    )
    assert deployed.training is not None
    assert deployed.training.wait(job["job_name"], timeout=120)["TrainingJobStatus"] == "Stopped"


def test_a_failure_before_any_job_has_nothing_to_stop(deployed: OfflineStack, handler: Any) -> None:
    assert handler("TrainingJobFunction")({"action": "stop", "state": load_event("run_failed_state.json")}) == {
        "job_name": None,
        "status": None,
        "stopped": False,
    }


def test_a_look_without_the_job_is_refused(deployed: OfflineStack, handler: Any) -> None:
    with pytest.raises(InvalidEventError, match="check lacks what it needs"):
        handler("TrainingJobFunction")({"action": "check", "run": load_event("run_context.json")})
