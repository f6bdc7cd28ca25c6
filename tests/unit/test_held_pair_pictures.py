"""Pictures of people stay with the people who may see them: the run report (which embeds the
pictures of the pairs to fix) and the relabel list's pictures are read through the report links,
by the readers the deployer named and by the batch's own team, not by an administrator's s3:*;
and the stack's HeldPairPictures (blur, show, omit) reaches the trainer that makes them.

The bucket policy is read as AWS would evaluate it (tests/iam.py): moto leaves conditional
Denies out, so this is where the guarantee is checked.
"""

from __future__ import annotations

import copy
import json
from typing import Any, get_args

import pytest

from functions.common.contracts import PictureMode
from tests import iam

ADMIN = f"arn:aws:iam::{iam.ACCOUNT}:role/Administrator"
AUDITOR = f"arn:aws:iam::{iam.ACCOUNT}:role/Auditor"
ANNOTATOR = f"arn:aws:iam::{iam.ACCOUNT}:role/munich-annotators"
REPORT = "reports/runs/ds-20261205-4f2a/report.html"
FIX = "reports/batches/munich-12/fix/1.png"


@pytest.fixture(scope="module")
def body() -> dict[str, Any]:
    return iam.template().body


def properties(body: dict[str, Any], logical_id: str, **parameters: str) -> Any:
    return iam.fake_resolver(body, **parameters).resolve(copy.deepcopy(body["Resources"][logical_id]["Properties"]))


def bucket_policy(body: dict[str, Any], **parameters: str) -> list[iam.ResourceStatement]:
    return iam.resource_policy(properties(body, "DataBucketPolicy", **parameters)["PolicyDocument"])


def read(body: dict[str, Any], key: str, team: str | None = None) -> iam.Need:
    bucket = iam.fake_resolver(body).resolve({"Ref": "DataBucket"})
    tags = {"aws:PrincipalTag/retrain-team": team} if team else {}
    return iam.Need("s3:GetObject", f"arn:aws:s3:::{bucket}/{key}", tags)


def principal(body: dict[str, Any], who: str) -> str:
    if who == "report links":  # the role whose sessions sign them, as CloudFormation names it
        return str(iam.fake_resolver(body).resolve({"Fn::GetAtt": ["ReportReaderRole", "Arn"]}))
    return {"admin": ADMIN, "auditor": AUDITOR, "annotator": ANNOTATOR}.get(who) or iam.role_arn(who)


@pytest.mark.parametrize(
    ("who", "key", "team", "denied"),
    [
        # The run report embeds the pictures: the report links open it, an administrator does not.
        ("admin", REPORT, None, True),
        ("report links", REPORT, None, False),
        ("NotifyFunction", REPORT, None, True),  # it reads summary.json, and signs links as the reader role
        ("NotifyFunction", "reports/runs/ds-20261205-4f2a/summary.json", None, False),
        ("EvaluateRunFunction", "reports/runs/ds-20261205-4f2a/summary.json", None, False),
        # The relabel list's pictures: the batch's team (its own uploads), not an administrator.
        ("admin", FIX, None, True),
        ("annotator", FIX, "munich", False),
        ("annotator", FIX, "paris", True),  # not a declared team
        ("annotator", FIX, None, True),
        ("report links", FIX, None, False),  # harmless: its own IAM reads reports/runs/ only
        # The lists themselves name files; they show no picture.
        ("admin", "reports/batches/munich-12/report.md", None, False),
    ],
)
def test_pictures_of_people_are_read_only_by_the_report_links_and_the_batchs_team(
    body: dict[str, Any], who: str, key: str, team: str | None, denied: bool
) -> None:
    policy = bucket_policy(body)

    assert iam.denied_by(policy, principal(body, who), read(body, key, team)) is denied


@pytest.mark.parametrize("key", [REPORT, FIX])
def test_the_readers_the_deployer_names_read_the_pictures_too(body: dict[str, Any], key: str) -> None:
    assert iam.denied_by(bucket_policy(body), AUDITOR, read(body, key))
    named = bucket_policy(body, DataReaderArns=AUDITOR)
    assert not iam.denied_by(named, AUDITOR, read(body, key))
    assert iam.denied_by(named, ADMIN, read(body, key))


def test_the_report_reader_role_may_read_run_reports_and_nothing_else(body: dict[str, Any]) -> None:
    statements = iam.statements_of(body, "ReportReaderRole", iam.fake_resolver(body))

    assert iam.allowed(statements, read(body, REPORT))
    for elsewhere in (FIX, "dataset/images/munich-12/x.jpg", "reports/batches/munich-12/report.md"):
        assert not iam.allowed(statements, read(body, elsewhere)), elsewhere


def test_the_stacks_picture_switch_reaches_the_trainer(body: dict[str, Any]) -> None:
    parameter = body["Parameters"]["HeldPairPictures"]
    assert sorted(parameter["AllowedValues"]) == sorted(get_args(PictureMode))
    assert parameter["Default"] == "blur"

    for mode in get_args(PictureMode):
        environment = properties(body, "TrainingJobFunction", HeldPairPictures=mode)["Environment"]["Variables"]
        assert json.loads(environment["TRAINING_JOB_HYPERPARAMETERS"])["held-pair-pictures"] == mode
