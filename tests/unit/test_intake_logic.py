"""S3 notifications, as AWS and moto send them, become object events with their real names."""

from __future__ import annotations

import json

import pytest

from functions.common.errors import InvalidEventError
from functions.intake.logic import parse_notification
from tests.conftest import load_event


def test_an_aws_notification_names_the_object_as_the_annotator_uploaded_it() -> None:
    (obj,) = parse_notification(json.dumps(load_event("s3_object_created_aws.json")))

    assert obj.key == "incoming/munich-2026-11-30/images/café corner 1+2.jpg"
    assert obj.batch == "munich-2026-11-30"
    assert obj.version_id == "3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY"
    assert obj.size == 482113
    assert obj.event_name == "ObjectCreated:Put"


def test_a_moto_notification_with_fewer_fields_and_encoded_slashes_still_parses() -> None:
    (obj,) = parse_notification(json.dumps(load_event("s3_object_created_moto.json")))

    assert obj.key == "incoming/batch-1/labels/street scene.png"
    assert obj.batch == "batch-1"


def test_the_s3_test_event_names_no_object() -> None:
    assert parse_notification(json.dumps(load_event("s3_test_event.json"))) == []


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("{not json", "not JSON"),
        ('{"Hello": "world"}', "no S3 Records"),
        ('{"Records": [{"eventName": "ObjectCreated:Put"}]}', "lacks a required field"),
    ],
)
def test_a_message_that_is_no_s3_notification_is_refused_with_the_reason(body: str, says: str) -> None:
    with pytest.raises(InvalidEventError, match=says):
        parse_notification(body)
