"""What tests of a retraining run do: drop scenes with a validation split, run to the end, read back."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from functions.common.contracts import split_for
from retrain.local.cloudformation.stack import OfflineStack
from tests.integration.data_drops import drain, executions, scene, upload, upload_pair, wait_until

RUN_TIMEOUT = 300  # seconds: a tiny job on two emulated hosts takes well under a minute here


@cache
def _split_of(seed: int) -> str:
    import hashlib  # noqa: PLC0415

    return split_for(hashlib.sha256(scene(seed).image).hexdigest(), 0.1)


def seeds_for(*, train: int, val: int, skip: int = 0) -> list[int]:
    """Scene seeds whose content hashes put `train` + `val` of them in those splits (from `skip`
    on, so two drops never share a scene)."""
    wanted = {"train": train, "val": val}
    seeds = []
    seed = skip * 1000
    while any(wanted.values()):
        split = _split_of(seed)
        if wanted[split]:
            wanted[split] -= 1
            seeds.append(seed)
        seed += 1
    return seeds


def drop_with_validation(
    stack: OfflineStack, batch: str, *, train: int, val: int, skip: int = 0, marker: bool = True
) -> list[int]:
    """Upload `train` + `val` scenes in those splits, then the batch's `_COMPLETE` marker."""
    seeds = seeds_for(train=train, val=val, skip=skip)
    for seed in seeds:
        upload_pair(stack, batch, f"scene-{seed}", scene(seed))
    if marker:
        upload(stack, f"incoming/{batch}/_COMPLETE", b"")
    return seeds


def run_to_end(stack: OfflineStack, *, after: int = 0, timeout: float = RUN_TIMEOUT) -> dict[str, Any]:
    """Deliver the drop, wait for run number `after + 1` to end; its DescribeExecution."""
    drain(stack)
    wait_until(lambda: len(executions(stack)) > after, timeout=60, message="a run to start")
    newest = sorted(executions(stack), key=lambda e: e["startDate"])[after]
    return stack.wait_for_execution(newest["executionArn"], timeout=timeout)


def history_states(stack: OfflineStack, execution_arn: str) -> list[str]:
    """The states the execution entered, in order."""
    return [
        event["stateEnteredEventDetails"]["name"]
        for event in stack.history(execution_arn)
        if "stateEnteredEventDetails" in event
    ]


def job_names(stack: OfflineStack) -> list[str]:
    listed = stack.aws.sagemaker.list_training_jobs()
    return [job["TrainingJobName"] for job in listed["TrainingJobSummaries"]]


def read_json(stack: OfflineStack, key: str) -> Any:
    return json.loads(stack.aws.s3.get_object(Bucket=stack.ref("DataBucket"), Key=key)["Body"].read())


def released_code(stack: OfflineStack) -> dict[str, str]:
    """The trainer the stack released when it started (what PrepareRun fixes for each run)."""
    release = read_json(stack, "code/current.json")
    bucket = stack.ref("DataBucket")
    return {"uri": f"s3://{bucket}/code/{release['sha256']}/sourcedir.tar.gz", "sha256": release["sha256"]}


def release_and_look(stack: OfflineStack, run: str, source: str = "the state machine, the run finished") -> Any:
    """What a run's last state does: ReleaseFunction frees the run's lock and kicks the trigger,
    which looks for new data. The trigger's answer to that look."""
    trigger = stack.ref("TriggerFunction")

    def looks() -> list[Any]:
        return [i for i in stack.runtime.invocations if i.function == trigger]

    before = len(looks())
    request = {"holder": run, "source": source, "owes_message": False}  # the team was told before
    released = stack.runtime.invoke(stack.ref("ReleaseFunction"), request)
    assert not released.failed and released.payload["released"] is True, f"{run} did not hold the lock: {released}"
    wait_until(lambda: len(looks()) > before and not stack.runtime.queued.get(trigger), message="the trigger's look")
    look = looks()[-1]
    assert not look.failed, look.payload
    return look.payload
