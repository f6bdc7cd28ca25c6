"""Play EventBridge schedules for scheduled functions (moto's EventBridge does not call Lambda).

`rate(...)` expressions run at their rate; an `interval_override` runs every schedule at one
short interval, for demos and tests. `cron(...)` needs the override offline (we do not
re-implement cron), and says so.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from functions.common.errors import RetrainError
from retrain.local.lambda_runtime.lambdas import Invocation, LambdaRuntime

log = logging.getLogger(__name__)

_RATE = re.compile(r"^rate\((\d+)\s+(minute|minutes|hour|hours|day|days)\)$")
_UNIT_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}


class ScheduleError(RetrainError, ValueError):
    """A schedule expression the offline ticker cannot play."""


def rate_seconds(expression: str) -> float:
    match = _RATE.match(expression.strip())
    if match is None:
        raise ScheduleError(
            f"offline, only rate(...) schedules run by themselves; {expression!r} needs "
            "`--tick-seconds` (or Ticker(interval_override=...))"
        )
    count, unit = int(match.group(1)), match.group(2).rstrip("s")
    return float(count * _UNIT_SECONDS[unit])


@dataclass(frozen=True)
class Schedule:
    function: str
    rule_name: str
    expression: str
    payload: dict[str, Any] | None = None


class Ticker:
    def __init__(
        self,
        runtime: LambdaRuntime,
        *,
        region: str,
        account_id: str,
        interval_override: float | None = None,
    ) -> None:
        self._runtime = runtime
        self._region = region
        self._account_id = account_id
        self._interval_override = interval_override
        self._schedules: list[Schedule] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, schedule: Schedule) -> None:
        if self._interval_override is None:
            rate_seconds(schedule.expression)  # refuse at set-up, not at the first tick
        self._schedules.append(schedule)

    @property
    def schedules(self) -> list[Schedule]:
        return list(self._schedules)

    def interval(self, schedule: Schedule) -> float:
        if self._interval_override is not None:
            return self._interval_override
        return rate_seconds(schedule.expression)

    def tick(self, schedule: Schedule) -> Invocation:
        """Fire one schedule now, with the event EventBridge Scheduler's rule target receives."""
        event = schedule.payload or {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": "Scheduled Event",
            "source": "aws.events",
            "account": self._account_id,
            "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": self._region,
            "resources": [f"arn:aws:events:{self._region}:{self._account_id}:rule/{schedule.rule_name}"],
            "detail": {},
        }
        return self._runtime.invoke(schedule.function, event)

    def tick_all(self) -> list[Invocation]:
        return [self.tick(schedule) for schedule in self._schedules]

    def start(self) -> None:
        if not self._schedules:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="ticker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _run(self) -> None:
        due = {id(s): time.monotonic() + self.interval(s) for s in self._schedules}
        while not self._stop.is_set():
            now = time.monotonic()
            for schedule in self._schedules:
                if now >= due[id(schedule)]:
                    due[id(schedule)] = now + self.interval(schedule)
                    try:
                        invocation = self.tick(schedule)
                    except Exception:
                        log.exception("schedule %s failed to run", schedule.rule_name)
                        continue
                    if invocation.failed:
                        log.warning("%s failed: %s", schedule.function, invocation.payload)
            next_due = min(due.values()) - time.monotonic()
            self._stop.wait(max(0.05, min(next_due, 1.0)))
