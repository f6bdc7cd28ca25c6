"""What a run's screening does to its pairs' trust (functions/evaluate_run/trust.py, issue 34): the
pairs it left out are held, and listed for their team with their pictures; the pairs an independent
judgement passed are trusted; a person's decision stands. On moto's S3 and DynamoDB, with the
template's table; `screening.json` as the trainer writes it (trainer/screening/phase.py)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from moto import mock_aws

from functions.common.contracts import pair_digest
from functions.data.ledger import Ledger
from functions.data.models import Trust
from functions.data.storage import DataBucket
from functions.evaluate_run.trust import ScreenedBatch, ScreenedPair, ScreeningFile, TrustKeeper
from retrain.local.cloudformation.stack import create_ledger_table
from tests.unit.trust_stories import curate, screened, sha256

NOW = datetime(2026, 12, 5, 12, tzinfo=UTC)
BUCKET, TABLE = "data", "ledger"
RUN = "ds-20261205T090000Z-4f2a"
PICTURE = b"\x89PNG\r\n\x1a\n a picture of the pair with the model's view beside it"


@pytest.fixture
def aws() -> Iterator[tuple[TrustKeeper, Any]]:
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        create_ledger_table(dynamodb, TABLE)
        yield TrustKeeper(Ledger(dynamodb, TABLE), DataBucket(s3, BUCKET)), s3


def pair(batch: str, stem: str, verdict: str, *, quality: float = 0.9, picture: bool = False) -> ScreenedPair:
    """One pair as the screening judged it; its contents are those `trust_stories.curate` curates."""
    return ScreenedPair(
        image=f"images/{batch}/{stem}.jpg",
        label=f"labels/{batch}/{stem}.png",
        image_sha256=sha256(f"{batch}/{stem}"),
        label_sha256=sha256(f"{batch}/{stem}: first labels"),
        verdict=verdict,
        contradicted=verdict in {"left out", "held"},
        quality=quality,
        confusion="labelled sidewalk where the model sees road (1200 pixels)" if verdict != "passed" else "",
        picture=f"screening/{batch}/{stem}.png" if picture else None,
    )


def digest_of(screened_pair: ScreenedPair) -> str:
    return pair_digest(screened_pair.image_sha256, screened_pair.label_sha256)


def screening(*batches: tuple[str, ScreenedBatch]) -> ScreeningFile:
    return ScreeningFile(model="accepted-model", batches=dict(batches))


def munich(*, independent: bool = True) -> ScreenedBatch:
    """Four pairs judged: the two worst left out, two passed."""
    return ScreenedBatch(
        team="munich",
        verdict="left out",
        independent=independent,
        pair_count=4,
        judged=4,
        contradicted=2,
        share=0.5,
        reasons=["2 of 4 pairs contradicted by the accepted model"],
        pairs=[
            pair("munich-01", "scene-3", "left out", quality=0.05, picture=True),
            pair("munich-01", "scene-1", "left out", quality=0.2, picture=True),
            pair("munich-01", "scene-0", "passed"),
            pair("munich-01", "scene-2", "passed"),
        ],
    )


def verdicts(keeper: TrustKeeper, batch: str) -> dict[str, Trust]:
    found = keeper.ledger.trust(batch)
    return dict(found.pairs) if found else {}


def test_left_out_pairs_are_held_and_listed_worst_first_with_their_pictures_beside_the_report(
    aws: tuple[TrustKeeper, Any],
) -> None:
    keeper, s3 = aws
    curate(keeper.ledger, "munich-01", ["scene-0", "scene-1", "scene-2", "scene-3"], at=NOW)
    judged = munich()
    pictures = {"screening/munich-01/scene-3.png": PICTURE, "screening/munich-01/scene-1.png": PICTURE + b"!"}

    changes = keeper.record(RUN, screening(("munich-01", judged)), pictures=pictures, now=NOW)

    worst, second, passed, also_passed = judged.pairs
    assert verdicts(keeper, "munich-01") == {
        digest_of(worst): Trust.HELD,
        digest_of(second): Trust.HELD,
        digest_of(passed): Trust.TRUSTED,
        digest_of(also_passed): Trust.TRUSTED,
    }
    assert (changes.left_out, changes.trusted) == ({"munich-01": 2}, {"munich-01": 2})
    record = keeper.ledger.trust("munich-01")
    assert record is not None and record.last is not None
    assert (record.last.by, record.last.run, record.last.pairs) == (f"run {RUN}'s screening", RUN, 4)
    assert [(p.image, p.picture) for p in record.to_fix] == [
        ("images/munich-01/scene-3.jpg", "fix/1.png"),
        ("images/munich-01/scene-1.jpg", "fix/2.png"),
    ], "the relabel list, worst first, each with its picture"
    for number, name in ((1, "scene-3"), (2, "scene-1")):
        copied = s3.get_object(Bucket=BUCKET, Key=f"reports/batches/munich-01/fix/{number}.png")["Body"].read()
        assert copied == pictures[f"screening/munich-01/{name}.png"], f"fix/{number}.png is not {name}'s picture"


def test_the_batch_report_is_rewritten_with_the_relabel_list_and_what_to_do(aws: tuple[TrustKeeper, Any]) -> None:
    keeper, s3 = aws
    curate(keeper.ledger, "munich-01", ["scene-0", "scene-1", "scene-2", "scene-3"], at=NOW)
    pictures = {"screening/munich-01/scene-3.png": PICTURE, "screening/munich-01/scene-1.png": PICTURE}

    keeper.record(RUN, screening(("munich-01", munich())), pictures=pictures, now=NOW)

    report = keeper.bucket.get_json("reports/batches/munich-01/report.json")
    trust = report["trust"]
    assert trust["summary"] == "2 held, 2 trusted" and trust["pairs"]["held"] == 2, trust
    assert [p["image"] for p in trust["to_fix"]] == ["images/munich-01/scene-3.jpg", "images/munich-01/scene-1.jpg"]
    (decision,) = trust["decisions"]
    assert (decision["by"], decision["reasons"]) == (
        f"run {RUN}'s screening",
        ["2 of 4 pairs contradicted by the accepted model"],
    )
    markdown = s3.get_object(Bucket=BUCKET, Key="reports/batches/munich-01/report.md")["Body"].read().decode()
    for said in (
        "## Held: left out of training",
        "## Pairs to fix, worst first",
        "- `images/munich-01/scene-3.jpg`: labelled sidewalk where the model sees road (1200 pixels) "
        "(label quality 0.05) ![scene-3](fix/1.png)",
        "upload corrected labels under the same batch",
        "retrain data release munich-01 --reason",
    ):
        assert said in markdown, f"{said!r} missing from the report:\n{markdown}"


def test_blurred_pictures_go_beside_the_report_which_says_they_are_blurred(aws: tuple[TrustKeeper, Any]) -> None:
    keeper, s3 = aws
    curate(keeper.ledger, "munich-01", ["scene-0", "scene-1", "scene-2", "scene-3"], at=NOW)
    pictures = {"screening/munich-01/scene-3.png": PICTURE, "screening/munich-01/scene-1.png": PICTURE}
    judged = screening(("munich-01", munich())).model_copy(update={"pictures": "blur"})

    keeper.record(RUN, judged, pictures=pictures, now=NOW)

    assert s3.get_object(Bucket=BUCKET, Key="reports/batches/munich-01/fix/1.png")["Body"].read() == PICTURE
    markdown = s3.get_object(Bucket=BUCKET, Key="reports/batches/munich-01/report.md")["Body"].read().decode()
    assert "![scene-3](fix/1.png)" in markdown
    assert "The pictures are blurred so that no face or number plate can be read" in markdown, markdown


def test_with_pictures_omitted_the_relabel_list_names_the_pairs_and_says_why_there_is_no_picture(
    aws: tuple[TrustKeeper, Any],
) -> None:
    keeper, s3 = aws
    curate(keeper.ledger, "munich-01", ["scene-0", "scene-1", "scene-2", "scene-3"], at=NOW)
    # As the trainer writes it with --held-pair-pictures omit: the worst pairs named, not pictured.
    judged = screening(("munich-01", munich())).model_copy(update={"pictures": "omit"})
    for screened_pair in judged.batches["munich-01"].pairs:
        screened_pair.picture = None

    keeper.record(RUN, judged, pictures={}, now=NOW)

    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="reports/batches/munich-01/fix/").get("Contents", [])
    assert listed == [], "no picture beside the report"
    record = keeper.ledger.trust("munich-01")
    assert record is not None and [p.picture for p in record.to_fix] == [None, None]
    markdown = s3.get_object(Bucket=BUCKET, Key="reports/batches/munich-01/report.md")["Body"].read().decode()
    assert "- `images/munich-01/scene-3.jpg`: labelled sidewalk where the model sees road" in markdown
    assert "![" not in markdown
    assert "No pictures: the images show faces and number plates" in markdown, markdown
    assert "(HeldPairPictures omit)" in markdown


def test_a_held_batch_holds_every_pair_and_its_report_says_how_to_release_or_purge_it(
    aws: tuple[TrustKeeper, Any],
) -> None:
    keeper, s3 = aws
    contents = curate(keeper.ledger, "berlin-07", ["street-0", "street-1"], at=NOW)
    held = ScreenedBatch(
        team="berlin",
        verdict="held",
        held=True,
        independent=True,
        reasons=["road labelled as sidewalk on 41 % of its pixels"],
        pairs=[pair("berlin-07", "street-0", "held"), pair("berlin-07", "street-1", "held")],
    )

    changes = keeper.record(RUN, screening(("berlin-07", held)), pictures={}, now=NOW)

    assert changes.held == {"berlin-07": ["road labelled as sidewalk on 41 % of its pixels"]}
    assert verdicts(keeper, "berlin-07") == dict.fromkeys(contents.values(), Trust.HELD)
    markdown = s3.get_object(Bucket=BUCKET, Key="reports/batches/berlin-07/report.md")["Body"].read().decode()
    assert "2 of its pairs are in no dataset version" in markdown, markdown
    assert "`retrain data purge berlin-07/`" in markdown and "road labelled as sidewalk" in markdown, markdown


def test_pairs_a_provisional_screening_passed_are_trained_on_but_not_trusted(aws: tuple[TrustKeeper, Any]) -> None:
    keeper, _ = aws
    curate(keeper.ledger, "munich-01", ["scene-0", "scene-1", "scene-2", "scene-3"], at=NOW)
    judged = munich(independent=False)

    changes = keeper.record(RUN, screening(("munich-01", judged)), pictures={}, now=NOW)

    assert changes.trusted == {}, "a judgement calibrated on unchecked labels earns no trust"
    assert set(verdicts(keeper, "munich-01").values()) == {Trust.HELD}, "its left-out pairs are held all the same"


def test_a_person_released_pair_is_never_held_again_and_earlier_trust_stands(aws: tuple[TrustKeeper, Any]) -> None:
    keeper, _ = aws
    curate(keeper.ledger, "munich-01", ["scene-0", "scene-1", "scene-2", "scene-3"], at=NOW)
    judged = munich()
    worst, second, _, _ = judged.pairs
    screened(
        keeper.ledger,
        "munich-01",
        {digest_of(worst): Trust.RELEASED, digest_of(second): Trust.TRUSTED},
        run="an-earlier-run",
        at=NOW,
    )

    changes = keeper.record(RUN, screening(("munich-01", judged)), pictures={}, now=NOW)

    found = verdicts(keeper, "munich-01")
    assert found[digest_of(worst)] is Trust.RELEASED, "a released pair was held again automatically"
    assert found[digest_of(second)] is Trust.TRUSTED, "an earlier independent judgement was overturned"
    assert changes.left_out == {"munich-01": 0}, "no pair was newly held"


def test_a_retry_records_the_same_verdicts(aws: tuple[TrustKeeper, Any]) -> None:
    keeper, _ = aws
    curate(keeper.ledger, "munich-01", ["scene-0", "scene-1", "scene-2", "scene-3"], at=NOW)
    judged = screening(("munich-01", munich()))

    first = keeper.record(RUN, judged, pictures={}, now=NOW)
    found = verdicts(keeper, "munich-01")
    again = keeper.record(RUN, judged, pictures={}, now=NOW)

    assert verdicts(keeper, "munich-01") == found, "a retry changed the verdicts"
    assert again.left_out == first.left_out and again.trusted == first.trusted
    assert len(keeper.ledger.trusts()) == 1
