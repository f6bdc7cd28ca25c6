"""EventBridge's default event bus for the offline stack: AWS services' events, delivered to the
functions whose rules match them, as AWS delivers them.

moto keeps rules and targets but calls no Lambda target, so the stack delivers the events itself.
`EventBus.emit` builds the event exactly as a Lambda target receives it (version, id,
detail-type, source, account, time, region, resources, detail), checks it against botocore's
PutEvents request shape, matches it against every rule with moto's own pattern matcher, and
invokes each matching rule's function asynchronously (InvocationType Event), as EventBridge does:
a delivery that fails is logged and recorded, never raised into whoever emitted the event.

What emits: the SageMaker emulator ("SageMaker Training Job State Change", on every
TrainingJobStatus change), `ExecutionWatcher` ("Step Functions Execution Status Change", for every
execution of a standard state machine), and anyone's `events.PutEvents` call (the stack serves it
through its emulator registry). `EventBus.lose` makes chosen events vanish, to test what a lost
event does; EventBridge and the services behind it deliver on a best-effort basis.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import TYPE_CHECKING, Any, cast

import botocore.session
from botocore.model import Shape
from botocore.utils import parse_timestamp
from botocore.validate import ParamValidator
from moto.events.models import EventPattern

from functions.common.errors import RetrainError
from functions.common.service_model import service_side_problems

if TYPE_CHECKING:
    from moto.events.utils import EventMessageType
    from mypy_boto3_stepfunctions import SFNClient

log = logging.getLogger(__name__)

DEFAULT_BUS = "default"
# PutEvents refuses an entry larger than this (Time, Source, DetailType, Detail and Resources).
MAX_ENTRY_BYTES = 256 * 1024
STATES_SOURCE = "aws.states"
EXECUTION_STATUS_CHANGE = "Step Functions Execution Status Change"
RUNNING = "RUNNING"

Event = dict[str, Any]
# Invokes a function (by ARN) with an event, asynchronously; raises when the invocation is refused.
AsyncInvoke = Callable[[str, Event], None]


class EventBusError(RetrainError, ValueError):
    """An event that PutEvents would refuse (`code`: its ErrorCode), or a rule EventBridge would not create."""

    def __init__(self, message: str, code: str = "InvalidArgument") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class EventRule:
    """A rule on the default bus whose one target is a function (SAM's EventBridgeRule event)."""

    function: str
    rule_name: str
    pattern: dict[str, Any]
    enabled: bool = True


@dataclass(frozen=True)
class Delivery:
    """One event handed to one rule's function; `error` says why the invocation was refused."""

    rule: str
    function: str
    event: Event
    error: str | None = None

    @property
    def accepted(self) -> bool:
        return self.error is None


@dataclass
class _Loss:
    predicate: Callable[[Event], bool]
    remaining: int | None


class EventBus:
    """The default event bus of one offline stack: its rules, what was emitted, what was delivered."""

    def __init__(self, *, region: str, account_id: str, invoke: AsyncInvoke) -> None:
        self.region = region
        self.account_id = account_id
        self._invoke = invoke
        self._rules: dict[str, tuple[EventRule, EventPattern]] = {}
        self._losses: list[_Loss] = []
        self._events: list[Event] = []
        self._lost: list[Event] = []
        self._deliveries: list[Delivery] = []
        self._lock = threading.RLock()
        self._sweepers: list[Callable[[], None]] = []
        self._sweep_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    # ---------------------------------------------------------------- rules --
    def add(self, rule: EventRule) -> None:
        """Route events that match `rule.pattern` to `rule.function` (a name or an ARN)."""
        compiled = compile_pattern(rule.pattern, rule.rule_name)
        with self._lock:
            self._rules[rule.rule_name] = (rule, compiled)

    @property
    def rules(self) -> list[EventRule]:
        with self._lock:
            return [rule for rule, _ in self._rules.values()]

    def matching(self, event: Event) -> list[EventRule]:
        """The enabled rules whose pattern matches `event`."""
        with self._lock:
            rules = list(self._rules.values())
        message = cast("EventMessageType", event)
        return [rule for rule, pattern in rules if rule.enabled and pattern.matches_event(message)]

    # ------------------------------------------------------------- emitting --
    def emit(
        self,
        source: str,
        detail_type: str,
        detail: dict[str, Any],
        resources: Iterable[str] = (),
        *,
        at: datetime | None = None,
    ) -> Event:
        """Put one event on the bus, as a service does (`at`: when it happened, default now); the
        event as its targets receive it."""
        moment = _utc(at or datetime.now(UTC))
        entry: dict[str, Any] = {
            "Source": source,
            "DetailType": detail_type,
            "Detail": json.dumps(detail),
            "Resources": list(resources),
            "Time": moment,
        }
        check_entry(entry)
        event: Event = {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": detail_type,
            "source": source,
            "account": self.account_id,
            "time": moment.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": self.region,
            "resources": list(entry["Resources"]),
            "detail": json.loads(entry["Detail"]),
        }
        self._publish(event)
        return event

    def put_events(self, params: dict[str, Any]) -> dict[str, Any]:
        """The `events.PutEvents` emulator (the registry has checked the request's shape)."""
        results: list[dict[str, Any]] = []
        for entry in params["Entries"]:
            try:
                _check_bus(str(entry.get("EventBusName") or DEFAULT_BUS))
                event = self.emit(
                    entry.get("Source", ""),
                    entry.get("DetailType", ""),
                    _detail(entry.get("Detail")),
                    entry.get("Resources", []),
                    at=parse_timestamp(entry["Time"]) if entry.get("Time") is not None else None,
                )
            except EventBusError as error:
                results.append({"ErrorCode": error.code, "ErrorMessage": str(error)})
            else:
                results.append({"EventId": event["id"]})
        failed = sum(1 for result in results if "ErrorCode" in result)
        return {"FailedEntryCount": failed, "Entries": results}

    def _publish(self, event: Event) -> None:
        with self._lock:  # re-entrant: a loss's predicate may read the bus
            self._events.append(copy.deepcopy(event))
            loss = next((loss for loss in self._losses if loss.remaining != 0 and loss.predicate(event)), None)
            if loss is not None:
                if loss.remaining is not None:
                    loss.remaining -= 1
                self._lost.append(copy.deepcopy(event))
            closed = self._closed
        if loss is not None:
            log.info("event %s (%s) lost on purpose", event["id"], event["detail-type"])
            return
        if closed:
            log.info("event %s (%s) not delivered: the stack is stopping", event["id"], event["detail-type"])
            return
        for rule in self.matching(event):
            try:
                # Each target gets its own copy, as each Lambda invocation gets its own payload.
                self._invoke(rule.function, copy.deepcopy(event))
            except Exception as error:  # EventBridge retries, then gives up; it never tells the sender
                log.warning("rule %s could not invoke %s: %s", rule.rule_name, rule.function, error)
                delivery = Delivery(rule.rule_name, rule.function, event, f"{type(error).__name__}: {error}")
            else:
                delivery = Delivery(rule.rule_name, rule.function, event)
            with self._lock:
                self._deliveries.append(delivery)

    # ------------------------------------------------------------- for tests --
    def lose(self, predicate: Callable[[Event], bool], times: int | None = None) -> None:
        """Events for which `predicate` holds vanish (recorded in `lost`, delivered to nobody):
        the next `times` of them, or every one when `times` is None."""
        with self._lock:
            self._losses.append(_Loss(predicate, times))

    @property
    def events(self) -> list[Event]:
        """Every event emitted so far, lost ones included, in the order emitted."""
        with self._lock:
            return copy.deepcopy(self._events)

    @property
    def lost(self) -> list[Event]:
        with self._lock:
            return copy.deepcopy(self._lost)

    @property
    def deliveries(self) -> list[Delivery]:
        with self._lock:
            return list(self._deliveries)

    def events_of(self, detail_type: str) -> list[Event]:
        return [event for event in self.events if event["detail-type"] == detail_type]

    def wait_for(self, predicate: Callable[[Event], bool], timeout: float = 10) -> Event:
        """The first emitted event for which `predicate` holds, sweeping until it comes."""
        deadline = time.monotonic() + timeout
        while True:
            found = next((event for event in self.events if predicate(event)), None)
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"no such event after {timeout} s")
            self.sweep()
            time.sleep(0.05)

    # -------------------------------------------------------------- sweeping --
    def add_sweeper(self, sweep: Callable[[], None]) -> None:
        """A source that finds its changes by looking (see `ExecutionWatcher`)."""
        self._sweepers.append(sweep)

    def sweep(self) -> None:
        """Let every sweeping source emit what changed since it last looked, now."""
        with self._sweep_lock:
            if self._closed:
                return
            for sweep in self._sweepers:
                sweep()

    def start(self, interval: float) -> None:
        """Sweep every `interval` seconds in the background until `close()`."""
        if self._thread is not None or not self._sweepers:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(interval,), name="eventbridge", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop sweeping and delivering (emitted events are still recorded)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        with self._sweep_lock, self._lock:
            self._closed = True

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.sweep()
            except Exception:
                log.exception("the event bus failed to sweep")


def compile_pattern(pattern: dict[str, Any], rule_name: str) -> EventPattern:
    """`pattern` as moto's matcher reads it; refused as PutRule refuses an invalid one."""
    try:
        return EventPattern.load(json.dumps(pattern))
    except Exception as error:  # moto's InvalidEventPatternException, PutRule's answer
        raise EventBusError(f"rule {rule_name}: invalid event pattern: {error}") from None


def check_entry(entry: dict[str, Any]) -> None:
    """Refuse an entry as PutEvents would: botocore's shape, what the service checks, the size."""
    shape = _put_events_shape()
    request = {"Entries": [entry]}
    report = ParamValidator().validate(request, shape)
    if report.has_errors():
        raise EventBusError(report.generate_report())
    problems = service_side_problems(request, shape)
    if problems:
        raise EventBusError("; ".join(problems))
    for member in ("Source", "DetailType", "Detail"):
        if not entry.get(member):
            raise EventBusError(f"Parameter {member} is not valid. Reason: {member} is a required argument.")
    _detail(entry["Detail"])
    size = 14 + sum(len(str(entry[member]).encode()) for member in ("Source", "DetailType", "Detail"))
    size += sum(len(resource.encode()) for resource in entry.get("Resources", []))
    if size > MAX_ENTRY_BYTES:
        raise EventBusError(f"the event is {size} bytes, PutEvents takes at most {MAX_ENTRY_BYTES}")


def _check_bus(bus: str) -> None:
    if bus.rsplit("/", 1)[-1] != DEFAULT_BUS:
        raise EventBusError(f"the offline stack has only the default event bus, not {bus}")


def _detail(text: str | None) -> dict[str, Any]:
    """Detail must be a JSON object."""
    try:
        detail = json.loads(text or "")
    except ValueError:
        detail = None
    if not isinstance(detail, dict):
        raise EventBusError("Detail is malformed.", code="MalformedDetail")
    return detail


def _utc(moment: datetime) -> datetime:
    # A naive time is UTC, as botocore reads one.
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


@cache
def _put_events_shape() -> Shape:
    shape = botocore.session.get_session().get_service_model("events").operation_model("PutEvents").input_shape
    assert shape is not None
    return shape


def epoch_millis(moment: datetime | None) -> int | None:
    """A time as AWS services' events carry it: milliseconds since the epoch."""
    return None if moment is None else int(moment.timestamp() * 1000)


class ExecutionWatcher:
    """Emits "Step Functions Execution Status Change" for every execution of every standard
    state machine whose status it finds changed (moto's engine tells nobody, so it looks)."""

    def __init__(self, stepfunctions: SFNClient, bus: EventBus) -> None:
        self._sfn = stepfunctions
        self._bus = bus
        self._seen: dict[str, str] = {}

    def sweep(self) -> None:
        for machines in self._sfn.get_paginator("list_state_machines").paginate():
            for machine in machines["stateMachines"]:
                if machine.get("type", "STANDARD") != "STANDARD":
                    continue  # express workflows send no status events
                pages = self._sfn.get_paginator("list_executions").paginate(stateMachineArn=machine["stateMachineArn"])
                for page in pages:
                    for execution in page["executions"]:
                        if self._seen.get(execution["executionArn"]) != execution["status"]:
                            self._changed(execution["executionArn"])

    def _changed(self, execution_arn: str) -> None:
        description: dict[str, Any] = dict(self._sfn.describe_execution(executionArn=execution_arn))
        status = description["status"]
        previous = self._seen.get(execution_arn)
        if previous == status:
            return
        if previous is None and status != RUNNING:
            # Started and ended between two looks: AWS would have sent the start too.
            self._emit({**description, "status": RUNNING, "stopDate": None, "output": None}, started=True)
        self._emit(description, started=status == RUNNING)
        self._seen[execution_arn] = status

    def _emit(self, description: dict[str, Any], *, started: bool) -> None:
        detail = execution_status_detail(description)
        moment = description["startDate"] if started else description.get("stopDate") or datetime.now(UTC)
        self._bus.emit(STATES_SOURCE, EXECUTION_STATUS_CHANGE, detail, [detail["executionArn"]], at=moment)


def execution_status_detail(description: dict[str, Any]) -> dict[str, Any]:
    """The event's detail: DescribeExecution's answer, times in epoch milliseconds, as AWS sends it."""
    output = description.get("output") if description["status"] == "SUCCEEDED" else None
    detail: dict[str, Any] = {
        "executionArn": description["executionArn"],
        "stateMachineArn": description["stateMachineArn"],
        "name": description["name"],
        "status": description["status"],
        "startDate": epoch_millis(description["startDate"]),
        "stopDate": epoch_millis(description.get("stopDate")),
        "input": description.get("input"),
        "inputDetails": {"included": True} if description.get("input") is not None else None,
        "output": output,
        "outputDetails": {"included": True} if output is not None else None,
    }
    for member in ("error", "cause"):
        if description.get(member) is not None and description["status"] != RUNNING:
            detail[member] = description[member]
    # Input and output are up to 256 KB each, and so is a whole event: what does not fit is left
    # out, and its details say so.
    for member in ("output", "input"):
        if len(json.dumps(detail).encode()) > MAX_ENTRY_BYTES - 1024 and detail[member] is not None:
            detail[member], detail[f"{member}Details"] = None, {"included": False}
    return detail
