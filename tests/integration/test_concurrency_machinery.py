"""The offline stack as unkind as AWS: invocations at once in worker processes, SQS out of order and twice.

What is checked here is the machinery itself (each worker a process with its function's own
environment, the throttle, the shuffle, the copies, nothing left running); what the system's
guarantees are under it is for the tests of those guarantees.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from retrain.local.cloudformation.stack import OfflineStack, StackOptions, StackOptionsError
from retrain.local.lambda_runtime.contract import FunctionSpec
from retrain.local.lambda_runtime.lambdas import Invocation
from tests.integration.conftest import DATA
from tests.integration.data_drops import (
    assert_every_upload_accounted_for_once,
    drain,
    fates,
    scene,
    upload,
    upload_pair,
    uploads,
    wait_until,
)

HANDLERS = "tests.integration.concurrency_handlers"


def quiet(**options: Any) -> StackOptions:
    """A stack without the trainer's upload and Slack, whose poller and ticker the test drives."""
    defaults: dict[str, Any] = {"upload_trainer": False, "slack": False, "poll": False, "tick": False}
    return StackOptions(**{**defaults, "batching_window_seconds": 0, **options})


def add_function(stack: OfflineStack, name: str, handler: str, timeout: int = 30, **environment: str) -> str:
    stack.runtime.add(FunctionSpec(name, name, f"{HANDLERS}.{handler}", environment, timeout_seconds=timeout))
    return name


def at_once(stack: OfflineStack, calls: list[tuple[str, dict[str, object]]]) -> list[Invocation]:
    """Every call from its own thread, all started together; the invocations in call order."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: stack.runtime.invoke(*call), calls))


def overlap(a: Invocation, b: Invocation) -> bool:
    return a.started_at < b.ended_at and b.started_at < a.ended_at


def worker_children() -> set[int]:
    """The worker processes this test process started that are still there (zombies included)."""
    found: set[int] = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue  # it ended while we looked
        if int(fields[1]) == os.getpid() and b"retrain.local.lambda_runtime.worker_process" in cmdline:
            found.add(int(stat.parent.name))
    return found


@pytest.fixture
def workers() -> Iterator[OfflineStack]:
    """A server-mode stack whose functions run up to four invocations at once (one per test: moto's
    backends are process-wide, so two stacks cannot be up at once)."""
    with OfflineStack(quiet(mode="server", lambda_concurrency=4)) as stack:
        yield stack


def test_four_invocations_of_one_function_run_at_once_each_in_its_own_reused_process(
    workers: OfflineStack,
) -> None:
    add_function(workers, "sleeper", "where_and_when")
    calls: list[tuple[str, dict[str, object]]] = [("sleeper", {"seconds": 1})] * 4

    cold = at_once(workers, calls)  # each call starts an execution environment of its own
    warm = at_once(workers, calls)  # and the next four find them waiting

    assert not [i for i in cold + warm if i.failed]
    pids = {i.worker for i in warm}
    assert len(pids) == 4, "four environments, one per concurrent invocation"
    assert os.getpid() not in pids, "none of them ran in the stack's own process"
    assert {i.payload["pid"] for i in warm} == pids
    assert {i.worker for i in cold} == pids, "the second round were warm starts of the same processes"
    assert max(i.started_at for i in warm) < min(i.ended_at for i in warm), "all four ran at one moment"


def test_a_fifth_invocation_waits_for_one_of_the_four_environments_to_come_free(workers: OfflineStack) -> None:
    add_function(workers, "throttled", "where_and_when")
    at_once(workers, [("throttled", {"seconds": 0})] * 4)  # the four environments, started

    five = at_once(workers, [("throttled", {"seconds": 1})] * 5)

    assert not [i for i in five if i.failed]
    assert len({i.worker for i in five}) == 4
    last = max(five, key=lambda i: i.started_at)
    others = [i for i in five if i is not last]
    assert last.started_at >= min(i.ended_at for i in others), "the fifth started only once one had ended"
    assert all(not overlap(last, i) for i in others if i.worker == last.worker)


def test_functions_running_at_once_each_see_only_their_own_environment(workers: OfflineStack) -> None:
    add_function(workers, "env-a", "where_and_when", WHO="a", ONLY_IN_A="yes")
    add_function(workers, "env-b", "where_and_when", WHO="b")
    event = {"names": ["WHO", "ONLY_IN_A"], "seconds": 0.2}

    runs = at_once(workers, [(name, event) for name in ["env-a", "env-b"] * 12])

    seen = {(i.function, i.payload["seen"]["WHO"], i.payload["seen"]["ONLY_IN_A"]) for i in runs}
    assert seen == {("env-a", "a", "yes"), ("env-b", "b", None)}
    a_runs = [i for i in runs if i.function == "env-a"]
    b_runs = [i for i in runs if i.function == "env-b"]
    assert any(overlap(a, b) for a in a_runs for b in b_runs), "the two functions did run at the same time"
    assert not {i.worker for i in a_runs} & {i.worker for i in b_runs}, "no process hosted both"
    assert "WHO" not in os.environ, "nothing reached the stack's own process either"


def test_a_handler_in_a_worker_reaches_other_functions_and_the_emulated_fsx(workers: OfflineStack) -> None:
    add_function(workers, "caller", "call_other_services")
    add_function(workers, "callee", "where_and_when", WHO="callee")

    invocation = workers.runtime.invoke("caller", {"other": "callee", "other_event": {"names": ["WHO"]}})

    assert not invocation.failed, invocation.payload
    answer = invocation.payload
    assert answer["other"]["seen"] == {"WHO": "callee"}
    assert not answer["other_failed"]
    assert len({answer["pid"], answer["other"]["pid"], os.getpid()}) == 3, "caller and callee: two workers"
    assert answer["file_systems"] == [workers.ref("DatasetFileSystem")]


def test_in_a_worker_errors_are_named_by_their_class_and_a_timeout_stops_the_process(
    workers: OfflineStack,
) -> None:
    workers.runtime.add(FunctionSpec("broken", "broken", "tests.integration.handlers.always_broken", {}))
    add_function(workers, "slow", "where_and_when", timeout=1)
    add_function(workers, "missing", "no_such_handler")

    broken = workers.runtime.invoke("broken", {"job": "j1"})
    missing = workers.runtime.invoke("missing", {})
    late = workers.runtime.invoke("slow", {"seconds": 5})
    after = workers.runtime.invoke("slow", {"seconds": 0})

    assert (broken.error_type, broken.payload["errorMessage"]) == ("JobStillBrokenError", "attempt for j1 failed")
    assert missing.error_type == "Runtime.HandlerNotFound", "an init error is the invocation's, named as Lambda does"
    assert late.error_type == "Sandbox.Timedout"
    assert late.payload["errorMessage"] == "Task timed out after 1.00 seconds"
    assert late.ended_at - late.started_at < 3, "stopped at its timeout, not at the end of its sleep"
    assert not Path(f"/proc/{late.worker}").exists(), "the timed-out environment is gone"
    assert not after.failed
    assert after.worker != late.worker, "the next call started a fresh environment"


def test_a_worker_that_dies_mid_invocation_fails_it_as_lambda_would_and_the_next_call_starts_afresh(
    workers: OfflineStack,
) -> None:
    add_function(workers, "crashing", "exit_when_asked")

    crashed = workers.runtime.invoke("crashing", {"exit_status": 3})
    after = workers.runtime.invoke("crashing", {})

    assert crashed.error_type == "Runtime.ExitError"
    assert crashed.payload["errorMessage"].endswith("Runtime exited with error: exit status 3")
    assert not after.failed
    assert after.worker != crashed.worker, "the dead environment was not handed out again"


def test_stopping_the_stack_ends_every_worker_busy_or_idle(tmp_path: Path) -> None:
    running = tmp_path / "running"
    with OfflineStack(quiet(mode="server", lambda_concurrency=3)) as stack:
        add_function(stack, "sleeper", "where_and_when", timeout=60)
        at_once(stack, [("sleeper", {"seconds": 0})] * 3)
        with ThreadPoolExecutor(1) as pool:
            busy = pool.submit(stack.runtime.invoke, "sleeper", {"seconds": 30, "touch": str(running)})
            wait_until(running.exists, message="the long call running in a worker")
            started = stack.runtime.worker_pids
            assert len(started) == 3
            assert started == worker_children()

            stack.stop()

            interrupted = busy.result(timeout=10)
    assert interrupted.error_type == "Runtime.ExitError", "the call in flight ended with its environment"
    assert worker_children() == set()
    assert not [pid for pid in started if Path(f"/proc/{pid}").exists()]


def test_mock_mode_refuses_concurrent_invocations_and_says_why() -> None:
    with pytest.raises(StackOptionsError, match="needs mode='server'") as refused:
        StackOptions(mode="mock", lambda_concurrency=2)

    assert "other processes cannot reach moto running in-process" in str(refused.value)


# ---------------------------------------------------------------- delivery --
def recording_intake(stack: OfflineStack) -> str:
    """The intake queue's function, its handler swapped for one that records what it was given."""
    spec = stack.runtime.spec(stack.ref("IntakeFunction"))
    stack.runtime.add(replace(spec, handler=f"{HANDLERS}.record_keys"))
    stack.runtime.cold_start(spec.name)
    return spec.name


def delivered(stack: OfflineStack, function: str) -> list[list[tuple[str, str]]]:
    """Each batch the function got, as (message id, S3 key) in delivery order (s3:TestEvent left out)."""
    batches = [i.payload["deliveries"] for i in stack.runtime.invocations if i.function == function]
    return [[(d["message"], key) for d in batch for key in d["keys"]] for batch in batches]


def put_objects(stack: OfflineStack, prefix: str, count: int) -> list[str]:
    """`count` uploads under `prefix`, one after the other; their keys in upload order."""
    keys = [f"{prefix}{n:03}.jpg" for n in range(count)]
    for key in keys:
        upload(stack, key, b"not looked at")
    return keys


def test_shuffled_delivery_reorders_within_batches_and_across_them_and_delivers_each_once() -> None:
    options = quiet(delivery="shuffled", delivery_seed=16)
    with OfflineStack(options) as stack:
        intake = recording_intake(stack)
        first = put_objects(stack, "incoming/order/images/a", 12)
        stack.poller.poll_once(stack.poller.mappings[0], wait_seconds=0.1)
        second = put_objects(stack, "incoming/order/images/b", 12)
        drain(stack)

        batches = [[key for _, key in batch] for batch in delivered(stack, intake)]

    in_order = [key for batch in batches for key in batch]
    assert Counter(in_order) == Counter(first + second), "every upload delivered, and once"
    assert in_order != first + second
    assert any(set(batch) & set(first) and set(batch) & set(second) for batch in batches[1:]), (
        "an early upload was held back into the batch of later ones"
    )


def most_at_once(invocations: list[Invocation]) -> int:
    """The most invocations running at one moment (at some invocation's start)."""
    return max(sum(1 for j in invocations if j.started_at <= i.started_at < j.ended_at) for i in invocations)


def test_the_intake_mapping_runs_no_more_batches_at_once_than_its_maximum_concurrency() -> None:
    # Four pollers and four execution environments, but the template's IntakeMaxConcurrency (the
    # mapping's ScalingConfig.MaximumConcurrency) is 2: Lambda polls less instead of throttling.
    options = quiet(mode="server", lambda_concurrency=4, parameters={"IntakeMaxConcurrency": "2"})
    with OfflineStack(options) as stack:
        spec = stack.runtime.spec(stack.ref("IntakeFunction"))
        slow = {**spec.environment, "HOLD_SECONDS": "0.5"}
        stack.runtime.add(replace(spec, handler=f"{HANDLERS}.record_keys", environment=slow))
        stack.runtime.cold_start(spec.name)
        keys = put_objects(stack, "incoming/cap/images/a", 250)  # batches of at most 100
        stack.poller.start()
        wait_until(lambda: sum(map(len, delivered(stack, spec.name))) >= len(keys), timeout=60, message="every upload")
        stack.poller.stop()
        invocations = [i for i in stack.runtime.invocations if i.function == spec.name]
        assert stack.poller.pollers == 4

    assert len(invocations) >= 3, "the drop took several batches"
    assert most_at_once(invocations) == 2


def test_duplicated_delivery_sends_some_notifications_twice_as_distinct_messages() -> None:
    options = quiet(delivery="duplicated", duplicate_fraction=0.5, delivery_seed=16)
    with OfflineStack(options) as stack:
        intake = recording_intake(stack)
        keys = put_objects(stack, "incoming/twice/images/", 20)
        drain(stack)

        deliveries = [pair for batch in delivered(stack, intake) for pair in batch]

    per_key = Counter(key for _, key in deliveries)
    assert set(per_key) == set(keys), "every upload delivered"
    assert set(per_key.values()) == {1, 2}, "some once, some twice, none more often"
    for key in (key for key, times in per_key.items() if times == 2):
        assert len({message for message, k in deliveries if k == key}) == 2, f"{key}: a copy is a new message"


def settled(stack: OfflineStack) -> bool:
    records = fates(stack)
    return uploads(stack) <= set(records) and all(r["status"] != "pending" for r in records.values())


def test_the_real_intake_in_workers_accounts_for_every_upload_once_when_delivery_is_duplicated() -> None:
    options = quiet(
        mode="server",
        parameters=DATA,
        lambda_concurrency=3,
        delivery="duplicated",
        duplicate_fraction=0.5,
        delivery_seed=16,
        poll=True,
    )
    with OfflineStack(options) as stack:
        for n in range(4):
            upload_pair(stack, "concurrent", f"scene {n}", scene(n))

        wait_until(lambda: settled(stack), timeout=120, message="every upload recorded")

        assert_every_upload_accounted_for_once(stack)
        assert stack.poller.copies_sent > 0, "some notifications did come twice"
        intake = [i for i in stack.runtime.invocations if "Intake" in i.function]
        assert os.getpid() not in {i.worker for i in intake}, "the intake ran in worker processes"
