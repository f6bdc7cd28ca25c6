"""A team's drop and the run it starts, as the label-trust scenario tests play them (issue 34):
drops exported by `retrain.synth` and uploaded as annotation tools do, runs waited for on the
offline stack, and what their evaluation published read back."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from functions.common.summary import RunSummary
from retrain.local.cloudformation.stack import OfflineStack
from retrain.synth import write_scenes
from tests.integration.data_drops import drain, executions, upload, wait_until


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
