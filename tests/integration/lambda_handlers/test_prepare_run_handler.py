"""The first state of a run, called as the state machine calls it."""

from __future__ import annotations

from typing import Any

import pytest

from functions.common.errors import DatasetVersionNotFoundError
from retrain.local.cloudformation.stack import OfflineStack
from tests.conftest import load_event
from tests.integration.runs import released_code


def test_a_run_on_a_frozen_version_learns_its_size(deployed: OfflineStack, handler: Any) -> None:
    run = load_event("run_input.json")
    key = f"dataset/manifests/{run['input']['dataset_version']}.jsonl"
    deployed.aws.s3.put_object(Bucket=deployed.ref("DataBucket"), Key=key, Body=b'{"a": 1}\n{"b": 2}\n\n')

    context = handler("PrepareRunFunction")(run)

    assert context["pair_count"] == 2
    assert context["run"] == run["execution"] and context["accepted"] is None, "the first run"
    assert context["manifest_uri"] == f"s3://{deployed.ref('DataBucket')}/{key}"
    assert context["code"] == released_code(deployed), "the run trains with the release it started with"


def test_a_run_on_a_version_that_was_never_frozen_fails_by_name(deployed: OfflineStack, handler: Any) -> None:
    with pytest.raises(DatasetVersionNotFoundError, match="has no manifest"):
        handler("PrepareRunFunction")(load_event("run_input.json"))
