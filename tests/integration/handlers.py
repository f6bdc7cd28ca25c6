"""Handlers that exist only to exercise the offline stack's mechanics in tests."""

from __future__ import annotations

import os
import time
from typing import Any


class JobStillBrokenError(Exception):
    """Raised on purpose, to show the state machine's Retry and Catch."""


def check_job(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Says the job is done once it has been asked `polls_needed` times."""
    polls = int(event.get("check", {}).get("polls", 0)) + 1
    return {"done": polls >= int(event["polls_needed"]), "polls": polls}


def always_broken(event: dict[str, Any], context: Any) -> dict[str, Any]:
    raise JobStillBrokenError(f"attempt for {event.get('job', '?')} failed")


def show_environment(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """What this function can see of the variables the test asks about."""
    return {name: os.environ.get(name) for name in event["names"]}


def sleepy(event: dict[str, Any], context: Any) -> dict[str, Any]:
    time.sleep(float(event["seconds"]))
    return {"slept": event["seconds"]}
