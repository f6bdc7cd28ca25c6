"""The crafted JPEG of the security review, dropped with a healthy pair: it no longer holds the
intake longer than its decode limit. It is quarantined with a reason that says so, and the pair
beside it is curated.

As logic, on an emulated ledger and bucket, with the file checks in a `DecoderProcess` as the
Lambda has them, at a limit of 1 s so that the story runs fast.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from functions.common import prefixes
from functions.data.models import FileStatus
from functions.validation import DEFAULT_CONFIG, DecoderProcess, Role, ValidationConfig
from tests.integration.data_drops import scene
from tests.unit.intake_harness import Harness, emulated_intake
from tests.unit.validation.corpus import jpeg, many_scans_jpeg

LIMIT = 1.0
# The healthy pair's checks, the ledger's and the bucket's work on moto, the child killed and reaped.
MARGIN = 3.0
CRAFTED = "incoming/b/images/crafted.jpg"
HEALTHY = ("incoming/b/images/street.jpg", "incoming/b/labels/street.png")


@pytest.fixture
def decoder() -> Iterator[DecoderProcess]:
    process = DecoderProcess(LIMIT)
    process(Role.IMAGE, jpeg(), "images/warm.jpg", DEFAULT_CONFIG)  # a Lambda's warm child
    yield process
    process.close()


def _drop_and_process(at: Harness) -> tuple[FileStatus, float]:
    """The crafted JPEG and a healthy pair, processed in one go as one batch's records; the
    crafted file's fate and how long the whole batch took."""
    pair = scene(1)
    events = [
        at.upload(CRAFTED, many_scans_jpeg()),
        at.upload(HEALTHY[0], pair.image),
        at.upload(HEALTHY[1], pair.label),
    ]
    started = time.monotonic()
    fates = [at.intake.process(event) for event in events]
    return fates[0], time.monotonic() - started


def _reason(at: Harness) -> dict[str, Any]:
    quarantined = prefixes.quarantine_key("b", prefixes.relative_to_batch(CRAFTED))
    (reason,) = json.loads(at.body(prefixes.reason_key(quarantined)))["reasons"]
    return reason  # type: ignore[no-any-return]


def _assert_pair_curated(at: Harness) -> None:
    curated = {key for key, _ in at.versions("dataset/")}
    assert curated == {"dataset/images/b/street.jpg", "dataset/labels/b/street.png"}


def test_the_crafted_jpeg_is_stopped_at_the_decode_limit_and_the_pair_beside_it_is_curated(
    decoder: DecoderProcess,
) -> None:
    # Its scans not counted, only the time limit stands between the file and the decoder.
    with emulated_intake(config=ValidationConfig(max_jpeg_scans=1_000_000), check_file=decoder) as at:
        fate, took = _drop_and_process(at)

        assert took < LIMIT + MARGIN, f"the batch took {took:.1f} s: the crafted file held the intake"
        assert fate is FileStatus.QUARANTINED
        reason = _reason(at)
        assert reason["code"] == "decode_too_slow"
        assert "longer than the limit of 1 s" in reason["message"]
        _assert_pair_curated(at)


def test_with_the_default_scan_cap_the_crafted_jpeg_is_refused_before_it_is_decoded(
    decoder: DecoderProcess,
) -> None:
    with emulated_intake(check_file=decoder) as at:
        fate, took = _drop_and_process(at)

        assert took < MARGIN
        assert fate is FileStatus.QUARANTINED
        assert _reason(at)["code"] == "jpeg_too_many_scans"
        _assert_pair_curated(at)
        assert decoder.started == 1, "nothing was killed: the file never reached the decoder"
