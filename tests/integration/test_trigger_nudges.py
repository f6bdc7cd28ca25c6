"""Five teams' markers close their batches at once, and each closing nudges the trigger: one run
starts, no nudge is lost, and FunctionThrottlesAlarm stays quiet.

The trigger takes its looks one at a time (its reserved concurrency is 1; docs/intake.md says
what that protects), so a nudge that finds it busy is throttled, and Lambda's asynchronous queue
tries it again. The offline runtime counts every throttle as the function's AWS/Lambda Throttles
metric would (`stack.runtime.throttles`), so what the alarm would see in normal work is measured
here: the trigger's own throttles (its turn-taking, which the alarm leaves out), and nothing for
the functions the alarm watches.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from itertools import combinations

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from retrain.local.cloudformation.stack import OfflineStack, StackOptions
from retrain.local.lambda_runtime.contract import FunctionSpec
from retrain.local.lambda_runtime.lambdas import Invocation
from tests.integration.conftest import DATA
from tests.integration.data_drops import drain, executions, scene, upload, upload_pair, wait_until
from tests.integration.helpers import create_machine

TRIGGER = "retrain-local-TriggerFunction"
TEAMS = [f"team-{number}" for number in range(5)]
PAIRS_PER_TEAM = 2


def one_at_a_time(stack: OfflineStack, name: str) -> str:
    """A function that sleeps as long as its event says, with a reserved concurrency of 1."""
    handler = "tests.integration.concurrency_handlers.where_and_when"
    stack.runtime.add(FunctionSpec(name, name, handler, {}, timeout_seconds=10, reserved_concurrency=1))
    return name


def overlapping(invocations: list[Invocation]) -> list[tuple[str, str]]:
    return [
        (a.request_id, b.request_id)
        for a, b in combinations(invocations, 2)
        if a.started_at < b.ended_at and b.started_at < a.ended_at
    ]


# ------------------------------------------------------- the runtime itself --
def test_the_template_s_reserved_concurrency_reaches_the_functions(stack: OfflineStack) -> None:
    reserved = {spec.logical_id: spec.reserved_concurrency for spec in stack.runtime.functions.values()}

    assert reserved["TriggerFunction"] == 1
    assert reserved["IntakeFunction"] == 20, "IntakeMaxConcurrency's default"
    assert reserved["SweeperFunction"] is None, "no reservation: the account's unreserved pool"


def test_an_asynchronous_invoke_that_finds_the_function_busy_is_throttled_and_retried_never_lost(
    stack: OfflineStack,
) -> None:
    name = one_at_a_time(stack, "serial")
    lambda_client = boto3.client("lambda", region_name="us-east-1")

    for _ in range(3):
        answer = lambda_client.invoke(
            FunctionName=name, InvocationType="Event", Payload=json.dumps({"seconds": 0.3}).encode()
        )
        assert answer["StatusCode"] == 202, "accepted, as Lambda accepts it into its asynchronous queue"
    wait_until(lambda: not stack.runtime.queued, timeout=20, message="the three invocations to have run")

    ran = [i for i in stack.runtime.invocations if i.function == name]
    assert len(ran) == 3 and not [i for i in ran if i.failed], "each ran once: none was dropped"
    assert not overlapping(ran), "never two at once"
    assert stack.runtime.throttles[name] >= 2, "the two that found the first running were throttled, and counted"


@pytest.fixture
def two_wide() -> Iterator[OfflineStack]:
    """Handlers in worker processes, two at a time: truly concurrent, as Lambda runs them. (In one
    process an admitted invocation may only be waiting for its turn, so it is not refused there.)"""
    options = StackOptions(
        mode="server", parameters=DATA, lambda_concurrency=2, poll=False, tick=False, upload_trainer=False, slack=False
    )
    with OfflineStack(options) as stack:
        yield stack


def test_a_synchronous_invoke_that_finds_the_function_busy_is_refused_with_429(two_wide: OfflineStack) -> None:
    stack = two_wide
    name = one_at_a_time(stack, "serial")
    # No retries: the refusal itself, as Lambda sends it (botocore retries it by default).
    lambda_client = boto3.client("lambda", region_name="us-east-1", config=Config(retries={"total_max_attempts": 1}))
    busy = threading.Thread(target=stack.runtime.invoke, args=(name, {"seconds": 1}))
    busy.start()
    wait_until(lambda: stack.runtime.in_flight.get(name) == 1, message="the first invocation to be running")

    with pytest.raises(ClientError) as refused:
        lambda_client.invoke(FunctionName=name, Payload=b'{"seconds": 0}')
    busy.join()
    answer = lambda_client.invoke(FunctionName=name, Payload=b'{"seconds": 0}')

    assert refused.value.response["Error"]["Code"] == "TooManyRequestsException"
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert stack.runtime.throttles[name] == 1
    assert answer["StatusCode"] == 200, "once the first has ended, there is room again"


# ------------------------------------------------------------------ the story --
@pytest.fixture
def five_wide() -> Iterator[OfflineStack]:
    """Five invocations of each function at once, each in its own process, as five of the intake's
    SQS pollers deliver five teams' markers on AWS; the test delivers them itself."""
    options = StackOptions(
        mode="server",
        parameters=DATA,
        lambda_concurrency=len(TEAMS),
        poll=False,
        tick=False,
        batching_window_seconds=0,
        upload_trainer=False,
        slack=False,
    )
    with OfflineStack(options) as stack:
        runs_hold_the_lock(stack)
        yield stack


def runs_hold_the_lock(stack: OfflineStack) -> None:
    """Point the trigger at a machine whose runs wait an hour: the run the nudges start holds the
    lock for the rest of the test, as a real run holds it while it trains."""
    machine = create_machine(stack, "waits_an_hour.asl.json")
    spec = stack.runtime.spec(TRIGGER)
    stack.runtime.add(replace(spec, environment={**spec.environment, "STATE_MACHINE_ARN": machine}))
    stack.runtime.cold_start(spec.name)


def watched_by_the_throttle_alarm(stack: OfflineStack) -> set[str]:
    (alarm,) = stack.aws.cloudwatch.describe_alarms(AlarmNames=[stack.ref("FunctionThrottlesAlarm")])["MetricAlarms"]
    return {
        query["MetricStat"]["Metric"]["Dimensions"][0]["Value"]
        for query in alarm["Metrics"]
        if "MetricStat" in query and query["MetricStat"]["Metric"]["MetricName"] == "Throttles"
    }


def markers_processed_at_once(stack: OfflineStack) -> None:
    """Every team's `_COMPLETE`, each delivered in a batch of its own, the five at the same time."""
    for batch in TEAMS:
        upload(stack, f"incoming/{batch}/_COMPLETE", b"")
    (mapping,) = stack.poller.mappings
    single = replace(mapping, batch_size=1)
    with ThreadPoolExecutor(len(TEAMS)) as pollers:
        delivered = list(pollers.map(lambda _: stack.poller.poll_once(single, wait_seconds=5).received, TEAMS))
    assert delivered == [1] * len(TEAMS), "one marker to each of five intake invocations at once"


@pytest.mark.slow(seconds=10)
def test_five_teams_closing_batches_at_once_start_one_run_and_the_throttle_alarm_stays_quiet(
    five_wide: OfflineStack,
) -> None:
    stack = five_wide
    for number, batch in enumerate(TEAMS):
        for pair in range(PAIRS_PER_TEAM):
            upload_pair(stack, batch, f"scene-{pair}", scene(100 * number + pair))
    drain(stack)  # curated; the batches stay open until their markers come

    started = time.monotonic()
    markers_processed_at_once(stack)
    wait_until(lambda: not stack.runtime.queued, timeout=120, message="every nudge to have run")
    seconds = time.monotonic() - started

    looks = [i for i in stack.runtime.invocations if i.function == TRIGGER]
    throttles = {name: count for name, count in stack.runtime.throttles.items() if count}
    print(f"{len(looks)} nudges ran in {seconds:.1f} s; throttles counted: {throttles}")
    assert len(looks) == len(TEAMS) and not [i for i in looks if i.failed], "each batch's nudge ran once"
    assert not overlapping(looks), "one trigger at a time, as its reserved concurrency of 1 has it"
    assert stack.runtime.throttles[TRIGGER] >= 1, "nudges at once take turns: the trigger's throttles, by design"
    watched = watched_by_the_throttle_alarm(stack)
    assert TRIGGER not in watched and len(watched) == len(stack.runtime.functions) - 1
    assert sum(stack.runtime.throttles[name] for name in watched) == 0, "FunctionThrottlesAlarm stays quiet"
    (run,) = executions(stack)
    assert [i.payload["started"] for i in looks if i.payload["started"]] == [run["name"]], "exactly one run"
