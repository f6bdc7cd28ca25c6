"""A batch closes and the trigger is asked to look now, without waiting for it; a stack with no
trigger function to kick waits for the trigger's schedule."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from botocore.stub import ANY

from functions.common.requests import TriggerInput
from functions.trigger.kick import TriggerKick
from tests.unit.fakes import stubbed


def test_the_trigger_is_invoked_without_waiting_and_told_why() -> None:
    with stubbed("lambda") as (client, stub):
        expected = {"FunctionName": "retrain-TriggerFunction", "InvocationType": "Event", "Payload": ANY}
        stub.add_response("invoke", {"StatusCode": 202}, expected)

        TriggerKick(client, "retrain-TriggerFunction")("batch closed")


def test_the_kick_says_the_reason_and_the_time() -> None:
    sent: list[dict[str, object]] = []

    class Recorder:
        def invoke(self, **request: object) -> None:
            sent.append(request)

    TriggerKick(Recorder(), "retrain-TriggerFunction")("quiet batches closed")  # type: ignore[arg-type]

    payload = json.loads(sent[0]["Payload"])  # type: ignore[arg-type]
    assert payload["source"] == "quiet batches closed"
    sent_at = datetime.fromisoformat(payload["time"])
    assert sent_at.utcoffset() == timedelta(0), "in UTC"
    assert TriggerInput.parse(payload) == TriggerInput(source="quiet batches closed", time=sent_at), "what it reads"


def test_without_a_trigger_function_nothing_is_invoked() -> None:
    with stubbed("lambda") as (client, _):  # nothing queued: an invoke fails the test
        TriggerKick(client, "")("batch closed")
