"""The intake when events come out of order, or a judgement dies half-way and is delivered again.

As logic, on an emulated ledger and bucket: the test hands the events over in the order it wants,
which the offline stack's shuffled delivery only does by chance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from functions.common.errors import ConcurrentUpdateError
from functions.common.models import S3ObjectEvent, written_before
from functions.data.ledger import Ledger
from functions.data.models import FileRecord, FileStatus, PairRecord, PairStatus
from functions.data.storage import DataBucket
from functions.intake.logic import PAIR_UP_ATTEMPTS, Intake
from functions.validation import DEFAULT_CONFIG
from tests.integration.data_drops import scene
from tests.unit.intake_harness import BUCKET, LEDGER, Harness, emulated_intake

IMAGE, LABEL = "incoming/b/images/x.jpg", "incoming/b/labels/x.png"


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        ("0055AED6DCD90281E5", "0055AED6DCD90281E6"),
        ("FF", "0100"),  # shorter: compared left-padded with zeros, as S3 says (plain text order is wrong)
        ("00ff", "0100"),  # hex digits in either case
    ],
)
def test_sequencers_order_the_events_of_one_key_as_s3_documents(earlier: str, later: str) -> None:
    assert written_before(earlier, later)
    assert not written_before(later, earlier)
    assert not written_before(earlier, earlier)


def test_without_both_sequencers_nothing_is_known_and_arrival_order_decides() -> None:
    assert not written_before(None, "01")
    assert not written_before("01", None)
    assert not written_before(None, None)


@pytest.fixture
def at() -> Iterator[Harness]:
    with emulated_intake() as harness:
        yield harness


def test_an_older_label_delivered_after_the_newer_one_never_replaces_it(at: Harness) -> None:
    image = at.upload(IMAGE, scene(1).image, sequencer="0A")
    first = at.upload(LABEL, scene(1).label, sequencer="0B")
    corrected = at.upload(LABEL, scene(2).label, sequencer="0C")

    at.intake.process(image)
    assert at.intake.process(corrected) is FileStatus.CURATED
    assert at.intake.process(first) is FileStatus.SUPERSEDED
    assert at.intake.process(first) is FileStatus.SUPERSEDED, "a redelivery changes nothing"

    assert at.body("dataset/labels/b/x.png") == scene(2).label, "dataset/ must hold the corrected label"
    records = fates_in_b(at)
    assert records[(LABEL, corrected.version_id)] is FileStatus.CURATED
    assert records[(LABEL, first.version_id)] is FileStatus.SUPERSEDED
    assert at.versions("incoming/") == [], "the older version's landing copy went too (by VersionId)"
    assert len(at.versions("dataset/labels/")) == 1, "curated once"
    pair, _ = at.intake.ledger.pair("b", "x") or pytest.fail("no pair item")
    assert pair.status is PairStatus.VALID
    assert pair.label is not None and pair.label.version == corrected.version_id


def test_a_newer_label_delivered_after_the_older_one_replaces_it(at: Harness) -> None:
    image = at.upload(IMAGE, scene(1).image, sequencer="0A")
    first = at.upload(LABEL, scene(1).label, sequencer="0B")
    corrected = at.upload(LABEL, scene(2).label, sequencer="0C")

    for event in (image, first, corrected):
        at.intake.process(event)

    assert at.body("dataset/labels/b/x.png") == scene(2).label
    records = fates_in_b(at)
    assert records[(LABEL, first.version_id)] is FileStatus.SUPERSEDED
    assert records[(LABEL, corrected.version_id)] is FileStatus.CURATED


def test_halves_of_a_pair_judged_at_the_same_moment_are_settled_in_one_invocation(at: Harness) -> None:
    image = at.upload(IMAGE, scene(5).image)
    label = at.upload(LABEL, scene(5).label)
    # The label's invocation, running beside this one, writes the pair first.
    beside = invocation_beside(at)

    class LosesTheRace(Ledger):
        raced = False

        def put_pair(self, record: PairRecord, revision: int) -> None:
            if not LosesTheRace.raced:
                LosesTheRace.raced = True
                assert beside.process(label) is FileStatus.PENDING
            super().put_pair(record, revision)

    pauses: list[float] = []
    at.intake.ledger, at.intake.pause = LosesTheRace(at.dynamodb, LEDGER), pauses.append

    assert at.intake.process(image) is FileStatus.CURATED, "the conflict is redone here, not left to SQS"

    assert len(pauses) == 1, "one conflict, one jittered pause"
    pair, _ = at.intake.ledger.pair("b", "x") or pytest.fail("no pair item")
    assert pair.status is PairStatus.VALID
    assert set(fates_in_b(at).values()) == {FileStatus.CURATED}


class FunctionDiedError(Exception):
    """The invocation ended here: a timeout, an out-of-memory kill, a throttled call out of retries."""


class DiesOnSecondCopy(DataBucket):
    """A bucket that, once armed, ends the invocation at its next copy of a label (a judgement's
    second copy), once."""

    armed = False

    def copy(self, key: str, version: str | None, destination: str, *, max_bytes: int | None = None) -> str | None:
        if "/labels/" in destination and DiesOnSecondCopy.armed:
            DiesOnSecondCopy.armed = False
            raise FunctionDiedError(f"the invocation died before copying {key} to {destination}")
        return super().copy(key, version, destination, max_bytes=max_bytes)


@pytest.fixture
def dying() -> Iterator[Harness]:
    DiesOnSecondCopy.armed = False
    with emulated_intake(DiesOnSecondCopy) as harness:
        yield harness


def test_a_judgement_that_died_between_its_two_copies_is_finished_by_the_redelivery(dying: Harness) -> None:
    # The label first; the image completes the pair, so the image's message carries the judgement.
    label = dying.upload(LABEL, scene(3).label)
    image = dying.upload(IMAGE, scene(3).image)
    dying.intake.process(label)
    DiesOnSecondCopy.armed = True
    with pytest.raises(FunctionDiedError):
        dying.intake.process(image)
    # The image was copied and its landing copy removed before the invocation died.
    assert [key for key, _ in dying.versions("incoming/")] == [LABEL]

    assert dying.intake.process(image) is FileStatus.CURATED, "the redelivery finishes the judgement"

    pair, _ = dying.intake.ledger.pair("b", "x") or pytest.fail("no pair item")
    assert pair.status is PairStatus.VALID
    assert {f.status for f in dying.intake.ledger.files("b")} == {FileStatus.CURATED}
    assert dying.versions("incoming/") == []
    curated = dying.versions("dataset/")
    assert [key for key, _ in curated] == ["dataset/images/b/x.jpg", "dataset/labels/b/x.png"], "each copied once"
    assert (pair.image_destination_version, pair.label_destination_version) == (curated[0][1], curated[1][1])
    assert dying.body("dataset/labels/b/x.png") == scene(3).label


def test_a_duplicate_set_aside_half_way_is_set_aside_whole_by_the_redelivery(dying: Harness) -> None:
    original = [dying.upload(f"incoming/a/{role}/x.{ext}", body) for role, ext, body in _files(4)]
    for event in original:
        dying.intake.process(event)
    copy_label = dying.upload(LABEL, scene(4).label)
    copy_image = dying.upload(IMAGE, scene(4).image)
    dying.intake.process(copy_label)
    DiesOnSecondCopy.armed = True  # the copy's judgement dies after setting its image aside
    with pytest.raises(FunctionDiedError):
        dying.intake.process(copy_image)

    assert dying.intake.process(copy_image) is FileStatus.DUPLICATE

    pair, _ = dying.intake.ledger.pair("b", "x") or pytest.fail("no pair item")
    assert (pair.status, pair.duplicate_of) == (PairStatus.DUPLICATE, "a/images/x.jpg")
    assert {f.status for f in dying.intake.ledger.files("b")} == {FileStatus.DUPLICATE}
    assert dying.versions("incoming/") == []
    assert sorted({key for key, _ in dying.versions("quarantine/b/")}) == [
        "quarantine/b/images/x.jpg",
        "quarantine/b/images/x.jpg.reason.json",
        "quarantine/b/labels/x.png",
        "quarantine/b/labels/x.png.reason.json",
    ]
    assert len(dying.versions("quarantine/b/images/x.jpg")) == 2, "the image (and its reason) set aside once"


class SomethingHappensBeforeACopy(DataBucket):
    """A bucket that, just before the first copy of the key `of`, runs `meanwhile` once: another
    invocation's work between this judgement's claim on the pair and its copy."""

    of: str | None = None
    meanwhile: Callable[[], object] | None = None

    def copy(self, key: str, version: str | None, destination: str, *, max_bytes: int | None = None) -> str | None:
        meanwhile = SomethingHappensBeforeACopy.meanwhile
        if key == SomethingHappensBeforeACopy.of and meanwhile is not None:
            SomethingHappensBeforeACopy.meanwhile = None
            meanwhile()
        return super().copy(key, version, destination, max_bytes=max_bytes)


@pytest.fixture
def racing() -> Iterator[Harness]:
    SomethingHappensBeforeACopy.of, SomethingHappensBeforeACopy.meanwhile = None, None
    with emulated_intake(SomethingHappensBeforeACopy) as harness:
        yield harness


def test_a_label_corrected_while_it_is_judged_is_found_superseded_not_failed(racing: Harness) -> None:
    image = racing.upload(IMAGE, scene(6).image, sequencer="0A")
    first = racing.upload(LABEL, scene(6).label, sequencer="0B")
    corrected = racing.upload(LABEL, scene(7).label, sequencer="0C")
    racing.intake.process(image)
    # The correction's invocation, beside this one, supersedes the first label (removing its
    # landing copy) after this judgement claimed the pair and before it copies that label.
    beside = invocation_beside(racing)
    beside_said: list[FileStatus] = []
    SomethingHappensBeforeACopy.of = LABEL
    SomethingHappensBeforeACopy.meanwhile = lambda: beside_said.append(beside.process(corrected))
    pauses: list[float] = []
    racing.intake.pause = pauses.append

    assert racing.intake.process(first) is FileStatus.SUPERSEDED, "redone here, not left to SQS"

    assert beside_said == [FileStatus.CURATED]
    assert len(pauses) == 1, "one change under the judgement, one jittered pause"
    assert_the_correction_won(racing, image, first, corrected, scene(7).label)


def test_a_label_superseded_while_the_image_judges_it_is_never_recorded_curated_afterwards(at: Harness) -> None:
    first = at.upload(LABEL, scene(9).label, sequencer="0A")
    image = at.upload(IMAGE, scene(9).image, sequencer="0B")
    corrected = at.upload(LABEL, scene(10).label, sequencer="0C")
    at.intake.process(first)
    beside = invocation_beside(at)
    beside_said: list[FileStatus] = []

    class CorrectionMeanwhile(Ledger):
        """The correction's invocation runs whole after the image's judgement copied the first
        label and before it records that label curated (as CI's run had it, by chance)."""

        raced = False

        def put_file(self, record: FileRecord) -> None:
            mine = (record.key, record.version, record.status) == (LABEL, first.version_id, FileStatus.CURATED)
            if mine and not CorrectionMeanwhile.raced:
                CorrectionMeanwhile.raced = True
                beside_said.append(beside.process(corrected))
            super().put_file(record)

    at.intake.ledger, at.intake.pause = CorrectionMeanwhile(at.dynamodb, LEDGER), lambda _: None

    assert at.intake.process(image) is FileStatus.CURATED

    assert beside_said == [FileStatus.CURATED]
    assert_the_correction_won(at, image, first, corrected, scene(10).label)


def test_a_partner_that_stays_gone_sends_the_message_back_rather_than_dropping_it(racing: Harness) -> None:
    label = racing.upload(LABEL, scene(8).label)
    image = racing.upload(IMAGE, scene(8).image)
    racing.intake.process(label)
    # The label's version is deleted under the judgement (an erasure), and stays deleted.
    SomethingHappensBeforeACopy.of = LABEL
    SomethingHappensBeforeACopy.meanwhile = lambda: racing.s3.delete_object(
        Bucket=BUCKET, Key=LABEL, VersionId=str(label.version_id)
    )
    pauses: list[float] = []
    racing.intake.pause = pauses.append

    # Not ObjectGoneError, which the handler answers "gone" and SQS then forgets: the message
    # comes back after the visibility timeout, and to the DLQ (and its alarm) in the end.
    with pytest.raises(ConcurrentUpdateError, match=r"pair b/x kept changing while judged: .*labels/x\.png.* is gone"):
        racing.intake.process(image)
    assert len(pauses) == PAIR_UP_ATTEMPTS - 1


def assert_the_correction_won(
    at: Harness, image: S3ObjectEvent, first: S3ObjectEvent, corrected: S3ObjectEvent, corrected_label: bytes
) -> None:
    """The pair holds the corrected label, curated; the first label's fate is `superseded` (and
    final); nothing is left in incoming/."""
    assert fates_in_b(at) == {
        (IMAGE, image.version_id): FileStatus.CURATED,
        (LABEL, first.version_id): FileStatus.SUPERSEDED,
        (LABEL, corrected.version_id): FileStatus.CURATED,
    }, "a superseded version's fate is final"
    pair, _ = at.intake.ledger.pair("b", "x") or pytest.fail("no pair item")
    assert pair.status is PairStatus.VALID
    assert pair.label is not None and pair.label.version == corrected.version_id
    assert at.body("dataset/labels/b/x.png") == corrected_label, "dataset/ holds the corrected label"
    assert at.versions("incoming/") == []


def invocation_beside(at: Harness) -> Intake:
    """Another invocation of the intake, on the same ledger table and bucket."""
    return Intake(ledger=Ledger(at.dynamodb, LEDGER), bucket=at.intake.bucket, config=DEFAULT_CONFIG)


def fates_in_b(at: Harness) -> dict[tuple[str, str | None], FileStatus]:
    """Each file record of batch b: (landing key, version) -> fate."""
    return {(f.key, f.version): f.status for f in at.intake.ledger.files("b")}


def _files(seed: int) -> list[tuple[str, str, bytes]]:
    pair = scene(seed)
    return [("images", "jpg", pair.image), ("labels", "png", pair.label)]
