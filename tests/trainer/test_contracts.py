"""The files between trainer and functions: splits never change, metrics.json is modelled."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from functions.common.contracts import (
    METRIC_DEFINITIONS,
    ManifestEntry,
    MetricsFile,
    metric_definitions,
    parse_manifest,
    split_for,
)

ROOT = Path(__file__).resolve().parents[2]


def _digests(count: int) -> list[str]:
    return [hashlib.sha256(str(i).encode()).hexdigest() for i in range(count)]


def test_a_pair_keeps_its_split_whatever_else_is_in_the_dataset() -> None:
    digests = _digests(500)
    alone = [split_for(digest, 0.2) for digest in digests]
    shuffled = {digest: split_for(digest, 0.2) for digest in reversed(digests)}
    assert alone == [shuffled[digest] for digest in digests]
    assert split_for(digests[0].upper(), 0.2) == alone[0], "hex case must not matter"


def test_about_the_requested_fraction_lands_in_validation() -> None:
    splits = [split_for(digest, 0.2) for digest in _digests(4000)]
    share = splits.count("val") / len(splits)
    assert 0.17 < share < 0.23, f"{share:.3f} of pairs in val for val_fraction=0.2"


def test_raising_the_fraction_only_moves_pairs_into_validation() -> None:
    for digest in _digests(1000):
        if split_for(digest, 0.1) == "val":
            assert split_for(digest, 0.3) == "val", f"{digest} left val when the fraction grew"


def test_an_impossible_fraction_is_refused() -> None:
    with pytest.raises(ValueError, match="val_fraction"):
        split_for(_digests(1)[0], 1.5)


def test_a_manifest_line_without_a_digest_is_rejected_with_its_line_number() -> None:
    line = '{"image": "images/a.jpg", "label": "labels/a.png", "split": "val", "batch": "b"}'
    with pytest.raises(ValueError, match="manifest line 1"):
        parse_manifest(line)


def test_a_manifest_entry_round_trips_through_json() -> None:
    digest = _digests(1)[0]
    entry = ManifestEntry(
        image="images/b/a.jpg",
        label="labels/b/a.png",
        image_sha256=digest,
        label_sha256=digest,
        image_version_id="v1",
        label_version_id=None,
        split=split_for(digest, 0.2),
        class_pixels={"0": 10},
        batch="b",
    )
    assert parse_manifest(entry.model_dump_json()) == [entry]


def test_metric_definitions_are_valid_for_create_training_job() -> None:
    definitions = metric_definitions()
    names = [definition["Name"] for definition in definitions]
    assert len(set(names)) == len(names) == len(METRIC_DEFINITIONS)
    assert all(set(d) == {"Name", "Regex"} and len(d["Regex"]) <= 500 for d in definitions)


def test_metrics_without_lineage_are_rejected() -> None:
    with pytest.raises(ValidationError, match="dataset_version"):
        MetricsFile.model_validate({"epochs": [], "seed": 0})


def test_the_lambdas_can_import_the_contracts_without_torch() -> None:
    code = "import sys, functions.common.contracts; print('torch' in sys.modules)"
    result = subprocess.run(  # noqa: PLW1510 (the output is asserted below)
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "False", f"contracts.py pulled in torch: {result.stderr}"
