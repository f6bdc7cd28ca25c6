"""Handlers that show how the offline stack runs functions: where, when, with what, given what."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

from functions.common import clients


def where_and_when(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Takes its time, then says which process ran it and what its environment said (and, when
    asked, leaves a file behind as it starts, so a test knows it is running)."""
    if "touch" in event:
        Path(event["touch"]).touch()
    time.sleep(float(event.get("seconds", 0)))
    return {"pid": os.getpid(), "seen": {name: os.environ.get(name) for name in event.get("names", [])}}


def record_keys(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Stands in for the intake: what each SQS message of the batch carried, in delivery order."""
    # Long enough, when asked, for batches of pollers working at once to overlap.
    time.sleep(float(os.environ.get("HOLD_SECONDS", "0")))
    deliveries = []
    for record in event["Records"]:
        body = json.loads(record["body"])
        # URL-encoded, as S3 sends keys; an s3:TestEvent has no Records.
        keys = [unquote_plus(entry["s3"]["object"]["key"]) for entry in body.get("Records", [])]
        deliveries.append({"message": record["messageId"], "keys": keys})
    return {"batchItemFailures": [], "deliveries": deliveries}


def call_other_services(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Reaches what the stack emulates in its own process: another function, and FSx."""
    answer = clients.lambda_().invoke(FunctionName=event["other"], Payload=json.dumps(event["other_event"]).encode())
    file_systems = clients.fsx().describe_file_systems()["FileSystems"]
    return {
        "pid": os.getpid(),
        "other": json.load(answer["Payload"]),
        "other_failed": "FunctionError" in answer,
        "file_systems": [fs["FileSystemId"] for fs in file_systems],
    }


def exit_when_asked(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Ends its process mid-invocation when the event says so, as a crash in native code would."""
    if "exit_status" in event:
        os._exit(int(event["exit_status"]))
    return {"pid": os.getpid()}
