"""`retrain runs start`: a run now, on fewer pairs than MinNewPairs, through the stack's own trigger.

The command invokes the stack's TriggerFunction over the stack's endpoint, as it would on AWS; the
test reads what happened from the stack itself (its executions, the manifest, the lock).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from functions.common import prefixes
from functions.common.contracts import parse_manifest
from retrain.cli import app
from retrain.local.cloudformation.stack import OfflineStack, StackOptions
from retrain.local.endpoint import discovery
from tests.integration.conftest import DATA
from tests.integration.data_drops import drain, executions, scene, upload, upload_pair
from tests.integration.runs import seeds_for
from tests.integration.test_data_operations import hold_runs, trigger


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[OfflineStack]:
    """A stack that waits for 500 new pairs, found by the commands as `retrain local up`'s is."""
    options = StackOptions(
        mode="server",
        parameters={**DATA, "MinNewPairs": "500"},
        poll=False,
        tick=False,
        # The functions run in this process: their logs go to a file, as to `retrain local up`'s
        # terminal, not into the command's stdout.
        function_log=tmp_path / "functions.log",
    )
    with OfflineStack(options) as offline:
        assert offline.endpoint_url is not None
        discovery.publish(
            discovery.LocalStackRecord(
                stack_name=offline.options.stack_name,
                region=offline.options.region,
                endpoint_url=offline.endpoint_url,
                outputs=dict(offline.created.outputs),
                pid=os.getpid(),
            )
        )
        try:
            yield offline
        finally:
            discovery.withdraw()


def start(*args: str) -> Any:
    return CliRunner().invoke(app, ["runs", "start", *args], env={"COLUMNS": "250"})


def drop(stack: OfflineStack, batch: str, seeds: list[int]) -> None:
    for seed in seeds:
        upload_pair(stack, batch, f"scene-{seed}", scene(seed))
    upload(stack, f"incoming/{batch}/_COMPLETE", b"")
    drain(stack)


def test_a_start_runs_on_the_few_new_pairs_there_are_under_the_lock(stack: OfflineStack) -> None:
    hold_runs(stack)  # a run holds the lock until the test ends (no training needed)

    nothing = start("--json")
    assert nothing.exit_code == 1, nothing.output
    assert json.loads(nothing.stdout) == {"started": None, "reason": "no new curated pairs in closed batches"}
    assert "no run started: no new curated pairs" in nothing.stderr

    drop(stack, "bonn", seeds_for(train=3, val=1))
    waited = trigger(stack, source="aws.events")  # the schedule's look: 4 pairs wait for 500
    assert waited["started"] is None and "below 500" in waited["reason"], waited

    started = start()
    assert started.exit_code == 0, started.output
    run = started.stdout.split("Started run ")[1].split(" ")[0]
    assert "4 new pairs, started on request by retrain runs start (" in started.stdout, started.stdout
    assert f"retrain runs show {run}" in started.stdout
    assert [e["name"] for e in executions(stack)] == [run]
    manifest = stack.aws.s3.get_object(Bucket=stack.ref("DataBucket"), Key=prefixes.manifest_key(run))
    entries = parse_manifest(manifest["Body"].read().decode())
    assert sorted(entry.split for entry in entries) == ["train", "train", "train", "val"]

    # The lock holds for a start as for any run: a second drop waits for the first run to end.
    drop(stack, "koeln", seeds_for(train=2, val=1, skip=1))
    refused = start("--json")
    assert refused.exit_code == 1, refused.output
    assert json.loads(refused.stdout)["reason"] == f"a run holds the lock: {run}"
    assert [e["name"] for e in executions(stack)] == [run]


def test_a_start_without_a_stack_says_how_to_get_one() -> None:
    result = start()
    assert result.exit_code == 2, result.output
    assert "no offline stack is running" in result.stderr and "--stack NAME" in result.stderr
