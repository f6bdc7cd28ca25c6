"""A team's drop and the run it starts, as the label-trust scenario tests play them (issue 34):
drops exported by `retrain.synth` and uploaded as annotation tools do, runs waited for on the
offline stack, and what their evaluation published read back."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from functions.common.summary import RunSummary
from retrain.local.cloudformation.stack import OfflineStack, StackOptions
from retrain.synth import write_scenes
from tests.integration.conftest import DATA, TRAINING
from tests.integration.data_drops import drain, executions, upload, wait_until

SWAP = {"road": "sky", "sky": "road", "building": "vegetation", "vegetation": "building"}
HYPERPARAMETERS = {"workers": 0, "lr": 0.05, "log-every": 0, "checkpoint-every-seconds": 0}


@contextmanager
def trust_stack(size: tuple[int, int], first_epochs: int, **hyperparameters: object) -> Iterator[OfflineStack]:
    """On a loopback server, as `retrain local up` runs it (the links in messages are real URLs),
    with a first run of `first_epochs` on scenes of `size`. The gate's tolerances are loose: these
    tests are about which pairs are judged, not by how much a model of seconds moves."""
    parameters = {
        **DATA,
        **TRAINING,
        "TrainingEpochs": str(first_epochs),
        "TrainingBatchSize": "8",
        "TrainingCrop": f"{size[0]}x{size[1]}",
        "TrainingExtraHyperparameters": json.dumps({**HYPERPARAMETERS, **hyperparameters}),
        "GateMiouTolerance": "0.1",
        "GateClassTolerance": "0.3",
    }
    options = StackOptions(mode="server", parameters=parameters, poll=False, tick=False, batching_window_seconds=0)
    with OfflineStack(options) as offline:
        yield offline


def later_runs(stack: OfflineStack, epochs: int, **hyperparameters: object) -> None:
    """The runs after the first train for `epochs` (warm-started from the accepted model)."""
    extra = json.dumps({**HYPERPARAMETERS, **hyperparameters, "epochs": epochs})
    stack.update_function_environment("TrainingJobFunction", TRAINING_EXTRA_HYPERPARAMETERS=extra)


def drop(
    stack: OfflineStack, folder: Path, batch: str, parts: list[dict[str, Any]], *, size: tuple[int, int]
) -> list[str]:
    """A team's drop as its annotation tool exports it: every pair, then the batch's marker.
    `parts`: `write_scenes` arguments for each part of the drop; the images' names, in order."""
    names = []
    for part in parts:
        for image, label in write_scenes(folder / batch, size=size, batch=batch, **part):
            upload(stack, f"incoming/{batch}/images/{image.name}", image.read_bytes())
            upload(stack, f"incoming/{batch}/labels/{label.name}", label.read_bytes())
            names.append(image.name)
    upload(stack, f"incoming/{batch}/_COMPLETE", b"")
    return names


def next_run(stack: OfflineStack, *, timeout: float = 500) -> dict[str, Any]:
    """Deliver what was dropped, wait for the run it starts to end; its DescribeExecution."""
    before = len(executions(stack))
    drain(stack)
    wait_until(lambda: len(executions(stack)) == before + 1, timeout=60, message="a run to start")
    newest = max(executions(stack), key=lambda e: e["startDate"])
    ended = stack.wait_for_execution(newest["executionArn"], timeout=timeout)
    assert ended["status"] == "SUCCEEDED", ended
    return ended


def read(stack: OfflineStack, key: str) -> bytes:
    body: bytes = stack.aws.s3.get_object(Bucket=stack.ref("DataBucket"), Key=key)["Body"].read()
    return body


def summary_of(stack: OfflineStack, run: str) -> RunSummary:
    return RunSummary.model_validate_json(read(stack, f"reports/runs/{run}/summary.json"))


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def screening_of(stack: OfflineStack, run: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(read(stack, f"reports/runs/{run}/screening.json"))
    return document
