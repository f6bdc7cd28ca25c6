"""A function for EventBridge rules in tests: it answers with the event it was given, so the
runtime's record of its invocations (`stack.runtime.invocations`) is the record of what arrived."""

from __future__ import annotations

from typing import Any


def record(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return event
