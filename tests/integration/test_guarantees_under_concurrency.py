"""Annotation teams drop their data while AWS is at its unkindest, and every guarantee still holds.

Eight invocations of each function run at once in worker processes, S3's notifications come
shuffled and some of them twice, and each team's `_COMPLETE` marker is processed before the files
it closes. Afterwards `retrain data audit` finds that bucket and ledger agree, every upload has
exactly one fate, and exactly one run started for the whole drop.

A failing test prints its delivery seed: `DELIVERY_SEED=<seed>` replays the delivery's choices
(which worker gets which batch when is still the machine's timing).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from itertools import combinations, pairwise
from typing import Any

import pytest

from functions.common.contracts import parse_manifest
from functions.data.ledger import Ledger
from functions.data.models import BatchStatus, PairStatus
from retrain.local.cloudformation.stack import OfflineStack, StackOptions
from tests.integration.conftest import DATA
from tests.integration.data_drops import (
    Pair,
    assert_every_upload_accounted_for_once,
    audit,
    bad_label,
    delete_markers,
    executions,
    fates,
    landing_versions,
    object_versions,
    scene,
    upload,
    upload_pair,
    uploads,
)
from tests.integration.helpers import create_machine, queue_depth
from tests.integration.runs import release_and_look

CONCURRENCY = 8
DEFAULT_SEED = 1616
TRIGGER = "retrain-local-TriggerFunction"
NOTHING_NEW = "no new curated pairs in closed batches"
# Eight invocations of up to 100 messages share two cores and one moto server here: one can take
# minutes. An invocation cut short by its timeout is not this file's story (redelivery after a
# crash is), so each has the time to finish.
ROOM_TO_FINISH = {"FunctionTimeoutSeconds": "300", "IntakeVisibilityTimeoutSeconds": "300"}


@pytest.fixture
def unkind(request: pytest.FixtureRequest) -> Iterator[OfflineStack]:
    """A stack as unkind as AWS: eight invocations of a function at once, each in its own process,
    notifications shuffled and some sent twice, and the schedules ticking every two seconds (the
    trigger looks while the intake works). Parametrize it indirectly to override template parameters."""
    seed = int(os.environ.get("DELIVERY_SEED", str(DEFAULT_SEED)))
    print(f"delivery seed {seed}: DELIVERY_SEED={seed} replays its choices")
    options = StackOptions(
        mode="server",
        parameters={**DATA, **ROOM_TO_FINISH, **getattr(request, "param", {})},
        lambda_concurrency=CONCURRENCY,
        delivery="duplicated",
        delivery_seed=seed,
        batching_window_seconds=0,
        tick_seconds=2,
        upload_trainer=False,
        slack=False,
    )
    with OfflineStack(options) as stack:
        runs_hold_the_lock(stack)
        yield stack


def runs_hold_the_lock(stack: OfflineStack) -> None:
    """Point the trigger at a machine whose runs wait an hour, holding the lock: the test ends a run
    itself (`end_the_run`), once the trigger that started it has returned. On AWS the trigger runs
    one invocation at a time (its reserved concurrency is 1), so a run's last state, which releases
    the lock and looks for new data, never runs beside the trigger still starting that run;
    offline every function runs eight-wide, so a machine that released at once would test what AWS
    rules out (what a run does is tests/integration/test_retraining_run.py's)."""
    machine = create_machine(stack, "waits_an_hour.asl.json")
    spec = stack.runtime.spec(TRIGGER)
    stack.runtime.add(replace(spec, environment={**spec.environment, "STATE_MACHINE_ARN": machine}))
    stack.runtime.cold_start(spec.name)  # a warm environment would still hold the template's machine


def end_the_run(stack: OfflineStack, run: str) -> dict[str, Any]:
    """The run ends and, as the real machine's last state does, releases the lock and has the
    trigger look for new data; what the trigger answered."""
    (execution,) = [e for e in executions(stack) if e["name"] == run]
    stack.aws.stepfunctions.stop_execution(executionArn=execution["executionArn"])
    return release_and_look(stack, run)  # type: ignore[no-any-return]


# ------------------------------------------------------------------ drops --
@dataclass(frozen=True)
class Item:
    """One pair a team uploads, and what should become of it."""

    batch: str
    stem: str
    pair: Pair
    broken: str | None = None  # the reason code both its files are quarantined with

    @property
    def image_key(self) -> str:
        return f"incoming/{self.batch}/images/{self.stem}.jpg"

    @property
    def label_key(self) -> str:
        return f"incoming/{self.batch}/labels/{self.stem}.png"

    @property
    def claim(self) -> str:
        """How the ledger names this image as the original of a duplicate."""
        return f"{self.batch}/images/{self.stem}.jpg"


def good(batch: str, seed: int) -> Item:
    return Item(batch, f"scene-{seed}", scene(seed))


def with_unknown_classes(batch: str, seed: int) -> Item:
    return Item(batch, f"unknown-classes-{seed}", Pair(scene(seed).image, bad_label([0, 77])), "mask_unknown_class")


def truncated(batch: str, seed: int) -> Item:
    pair = scene(seed)
    return Item(batch, f"truncated-{seed}", Pair(pair.image[: len(pair.image) // 2], pair.label), "image_truncated")


def same_photo(batch: str, original: Item) -> Item:
    """Another team's photo (and mask), uploaded under a name of this team's."""
    return Item(batch, f"same-photo-as-{original.batch}", original.pair)


def drop_markers_first(stack: OfflineStack, teams: dict[str, list[Item]]) -> None:
    """Every team's `_COMPLETE` first, processed (its batch closed) before any of its files is
    uploaded; then the teams' files interleaved, a pair from each in turn, some labels first."""
    for batch in teams:
        upload(stack, f"incoming/{batch}/_COMPLETE", b"")
    ledger = ledger_of(stack)
    eventually(
        lambda: all(closed(ledger, batch) for batch in teams), timeout=60, message="every marker closing its batch"
    )
    for turn in range(max(len(items) for items in teams.values())):
        for items in teams.values():
            if turn < len(items):
                item = items[turn]
                upload_pair(stack, item.batch, item.stem, item.pair, label_first=turn % 3 == 1)


def closed(ledger: Ledger, batch: str) -> bool:
    found = ledger.batch(batch)
    return found is not None and found[0].status is BatchStatus.CLOSED


# ------------------------------------------------------------ what became --
def ledger_of(stack: OfflineStack) -> Ledger:
    return Ledger(stack.aws.dynamodb, stack.ref("LedgerTable"))


def eventually(condition: Callable[[], bool], *, timeout: float, message: str, every: float = 1.0) -> None:
    """Wait for `condition`, looking every `every` seconds: each look scans the ledger, and the
    workers need the CPU more than the test does."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {message}")
        time.sleep(every)


def landed(stack: OfflineStack) -> bool:
    """Every upload but the markers has left the landing zone: a cheap look, before a scan of the
    ledger. (Not an empty queue: a copy of a message that found its original in progress waits
    out the visibility timeout, and then does nothing.)"""
    return all(key.endswith("/_COMPLETE") for key, _ in landing_versions(stack))


def everything_recorded(stack: OfflineStack) -> bool:
    records = fates(stack)
    return uploads(stack) <= set(records) and all(r["status"] != "pending" for r in records.values())


def triggers(stack: OfflineStack) -> list[dict[str, Any]]:
    """What every trigger invocation so far answered (failed ones too, as their error)."""
    return [i.payload for i in stack.runtime.invocations if i.function == TRIGGER]


def runs_started(stack: OfflineStack) -> list[str]:
    """The dataset versions the trigger's decisions started, one per decision."""
    return sorted(p["started"] for p in triggers(stack) if isinstance(p, dict) and p.get("started"))


def a_run_started(stack: OfflineStack) -> bool:
    return bool(runs_started(stack))


def spans(stack: OfflineStack) -> list[tuple[str, datetime, datetime]]:
    """When each execution ran: its start, and its stop (now, while it runs)."""
    sfn = stack.aws.stepfunctions
    found = []
    for execution in executions(stack):
        described = sfn.describe_execution(executionArn=execution["executionArn"])
        start = described["startDate"]
        found.append((described["name"], start, described.get("stopDate") or datetime.now(start.tzinfo)))
    return found


def assert_the_lock_was_never_held_twice(stack: OfflineStack) -> None:
    for (a, a_start, a_stop), (b, b_start, b_stop) in combinations(spans(stack), 2):
        assert not (a_start < b_stop and b_start < a_stop), f"runs {a} and {b} overlapped: the lock was held twice"


def curated_pairs(stack: OfflineStack) -> set[tuple[str, str]]:
    """(batch, stem) of every curated file: dataset/images/<batch>/<stem>.jpg and its label; each
    curated once (one version), and every image with its label."""
    images = object_versions(stack, "dataset/images/")
    labels = object_versions(stack, "dataset/labels/")
    twice = {key: versions for key, versions in {**images, **labels}.items() if len(versions) != 1}
    assert not twice, f"curated more than once (or deleted): {twice}"
    by_image = {tuple(key.removeprefix("dataset/images/").removesuffix(".jpg").split("/")) for key in images}
    by_label = {tuple(key.removeprefix("dataset/labels/").removesuffix(".png").split("/")) for key in labels}
    assert by_image == by_label, f"curated halves of pairs: {sorted(by_image ^ by_label)[:5]}"
    return {(batch, stem) for batch, stem in by_image}


def manifest_pairs(stack: OfflineStack, version: str) -> set[tuple[str, str]]:
    key = f"dataset/manifests/{version}.jsonl"
    body = stack.aws.s3.get_object(Bucket=stack.ref("DataBucket"), Key=key)["Body"].read().decode()
    entries = parse_manifest(body)
    pinned = [e.image.removeprefix("images/").removesuffix(".jpg").split("/", 1) for e in entries]
    assert len({tuple(p) for p in pinned}) == len(entries), "a pair listed twice in one manifest"
    return {(batch, stem) for batch, stem in pinned}


def file_fates(stack: OfflineStack, item: Item) -> list[dict[str, Any]]:
    """The ledger records of both of this item's files (one upload each)."""
    records = fates(stack)
    return [records[(key, version)] for key, version in uploads(stack) if key in (item.image_key, item.label_key)]


def assert_quarantined_with_reason(stack: OfflineStack, item: Item) -> None:
    records = file_fates(stack, item)
    assert len(records) == 2
    for record in records:
        codes = [reason["code"] for reason in record["reasons"]]
        assert (record["status"], codes) == ("quarantined", [item.broken]), record
        reason_key = f"{record['destination']}.reason.json"
        body = stack.aws.s3.get_object(Bucket=stack.ref("DataBucket"), Key=reason_key)["Body"].read()
        assert [r["code"] for r in json.loads(body)["reasons"]] == [item.broken], f"{reason_key} says otherwise"


def one_curated_the_other_its_duplicate(stack: OfflineStack, first: Item, second: Item) -> Item:
    """Of two uploads of one photo, whichever was judged first is curated and the other recorded as
    its duplicate (which one is the delivery's choice); the curated one."""
    statuses = {item: {r["status"] for r in file_fates(stack, item)} for item in (first, second)}
    curated = [item for item, found in statuses.items() if found == {"curated"}]
    assert len(curated) == 1, f"the same photo, uploaded twice: {statuses}"
    (original,) = curated
    (copy,) = {first, second} - {original}
    for record in file_fates(stack, copy):
        assert record["status"] == "duplicate", record
        assert record["duplicate_of"] == original.claim, record
        assert [r["code"] for r in record["reasons"]] == ["duplicate_image"], record
    found = ledger_of(stack).pair(copy.batch, copy.stem)
    assert found is not None and found[0].status is PairStatus.DUPLICATE, found
    assert found[0].duplicate_of == original.claim
    return original


def assert_audit_is_clean(stack: OfflineStack) -> dict[str, Any]:
    # No grace: nothing may hide behind "too recent".
    code, report = audit(stack, "--grace-seconds", "0")
    assert (code, report["discrepancies"], report["too_recent"]) == (0, [], []), report
    return report


# ---------------------------------------------------------------- stories --
TEAMS = ("munich-north", "leipzig-east", "jena-south")
GOOD_PAIRS_PER_TEAM = 160


def three_teams() -> tuple[dict[str, list[Item]], list[Item], list[tuple[Item, Item]]]:
    """Each team's drop: its good pairs, with a mask holding unknown classes, a truncated photo and
    a photo (and mask) another team also uploads spread among them. The drops, the broken items,
    and the pairs of uploads of one photo."""
    teams: dict[str, list[Item]] = {}
    for number, batch in enumerate(TEAMS):
        base = 1000 * (number + 1)
        teams[batch] = [good(batch, base + n) for n in range(GOOD_PAIRS_PER_TEAM)]
    broken: list[Item] = []
    twins: list[tuple[Item, Item]] = []
    for number, batch in enumerate(TEAMS):
        other = TEAMS[(number + 1) % len(TEAMS)]
        original = teams[other][0]
        copy = same_photo(batch, original)
        bad = [with_unknown_classes(batch, 100 + number), truncated(batch, 200 + number)]
        for position, item in zip(
            (GOOD_PAIRS_PER_TEAM // 4, GOOD_PAIRS_PER_TEAM // 2, 3 * GOOD_PAIRS_PER_TEAM // 4),
            [*bad, copy],
            strict=True,
        ):
            teams[batch].insert(position, item)
        broken += bad
        twins.append((original, copy))
    photos = [hashlib.sha256(item.pair.image).hexdigest() for items in teams.values() for item in items]
    assert len(set(photos)) == len(photos) - len(twins), "every other photo is a photo of its own"
    return teams, broken, twins


@pytest.mark.slow(seconds=150)
@pytest.mark.parametrize(
    "unkind",
    # One run for the whole drop: it starts once every good pair is curated.
    [{"MinNewPairs": str(len(TEAMS) * GOOD_PAIRS_PER_TEAM), "SettleSeconds": "0"}],
    indirect=True,
)
def test_three_teams_dropping_at_once_markers_first_each_file_gets_one_fate_and_one_run_starts(
    unkind: OfflineStack,
) -> None:
    # Measured: 174-195 s on two cores (981 uploads, about 200 of them delivered twice).
    teams, broken, twins = three_teams()

    drop_markers_first(unkind, teams)
    eventually(lambda: landed(unkind), timeout=480, every=2, message="every upload out of the landing zone")
    eventually(lambda: everything_recorded(unkind), timeout=60, message="every upload recorded")
    eventually(lambda: a_run_started(unkind), timeout=60, message="a run")

    assert unkind.poller.copies_sent > 0, "some notifications did come twice"
    originals = [one_curated_the_other_its_duplicate(unkind, *twin) for twin in twins]
    copies = {item for twin in twins for item in twin} - set(originals)
    expected = {(i.batch, i.stem) for items in teams.values() for i in items if i not in broken and i not in copies}
    assert len(expected) == len(TEAMS) * GOOD_PAIRS_PER_TEAM
    assert curated_pairs(unkind) == expected
    for item in broken:
        assert_quarantined_with_reason(unkind, item)
    (run,) = runs_started(unkind)
    assert manifest_pairs(unkind, run) == expected
    assert unkind.runtime.invoke(TRIGGER, {"source": "schedule"}).payload["reason"] == f"a run holds the lock: {run}"
    assert end_the_run(unkind, run) == {"started": None, "reason": NOTHING_NEW}
    assert runs_started(unkind) == [run]
    assert [name for name, _, _ in spans(unkind)] == [run], "one execution, the one the trigger's decision started"
    assert_the_lock_was_never_held_twice(unkind)
    assert_audit_is_clean(unkind)
    assert_every_upload_accounted_for_once(unkind)


SETTLE_SECONDS = 5
LATE_PAIRS = 40


def settled_at(stack: OfflineStack, batch: str) -> datetime:
    """When the batch settled: its last activity (`last_seen`) plus the settle period."""
    found = ledger_of(stack).batch(batch)
    assert found is not None
    return found[0].last_seen + timedelta(seconds=SETTLE_SECONDS)


def longest_pause(stack: OfflineStack, batch: str) -> float:
    """The longest time, in seconds, between two of the batch's files being recorded: were it the
    settle period or more, a run started in between would be right to leave the later ones out."""
    moments = sorted(
        datetime.fromisoformat(r["recorded_at"])
        for r in fates(stack).values()
        if r["batch"] == batch and r["status"] != "marker"
    )
    return max((b - a).total_seconds() for a, b in pairwise(moments))


@pytest.mark.slow(seconds=25)
@pytest.mark.parametrize("unkind", [{"MinNewPairs": "1", "SettleSeconds": str(SETTLE_SECONDS)}], indirect=True)
def test_files_that_arrive_after_their_marker_closed_the_batch_are_all_in_its_one_run(
    unkind: OfflineStack,
) -> None:
    # Measured: 20 s on two cores.
    batch = "dresden-late"
    drop = [good(batch, 5000 + n) for n in range(LATE_PAIRS)]

    # The marker closes the batch before any of its files is uploaded: all of them come late.
    drop_markers_first(unkind, {batch: drop})
    eventually(lambda: landed(unkind), timeout=240, every=2, message="every upload out of the landing zone")
    eventually(lambda: everything_recorded(unkind), timeout=60, message="every upload recorded")
    eventually(lambda: a_run_started(unkind), timeout=60, message="a run, once the batch settled")

    pause = longest_pause(unkind, batch)
    assert pause < SETTLE_SECONDS, f"the drop itself paused {pause:.1f} s, the settle period or more"
    every_pair = {(item.batch, item.stem) for item in drop}
    assert curated_pairs(unkind) == every_pair
    (run,) = runs_started(unkind)
    assert manifest_pairs(unkind, run) == every_pair, "the run left late pairs out: frozen before the batch settled"
    ((name, started, _),) = spans(unkind)
    assert name == run
    assert started >= settled_at(unkind, batch), f"{run} started before {batch} settled"
    assert end_the_run(unkind, run) == {"started": None, "reason": NOTHING_NEW}
    assert runs_started(unkind) == [run]
    assert_the_lock_was_never_held_twice(unkind)
    assert_audit_is_clean(unkind)
    assert_every_upload_accounted_for_once(unkind)


CORRECTED_PAIRS = 40


def curated_body(stack: OfflineStack, key: str) -> bytes:
    return stack.aws.s3.get_object(Bucket=stack.ref("DataBucket"), Key=key)["Body"].read()  # type: ignore[no-any-return]


def fate_of(stack: OfflineStack, key: str, version: str) -> str:
    return str(fates(stack)[(key, version)]["status"])


def arrived_out_of_order(stack: OfflineStack, key: str, older: str, newer: str) -> bool:
    """Whether the older version was given its fate after the newer one had been judged: the
    intake saw the newer first (in order, the older is superseded before the newer is recorded)."""
    records = fates(stack)
    return bool(records[(key, older)]["recorded_at"] > records[(key, newer)]["recorded_at"])


@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize("unkind", [{"MinNewPairs": "100000"}], indirect=True)
def test_labels_corrected_seconds_after_their_upload_are_what_is_curated_whatever_the_delivery_order(
    unkind: OfflineStack,
) -> None:
    # Measured: about 30 s on two cores.
    batch = "hamburg-fixes"
    uploaded: list[tuple[str, str, str, bytes]] = []  # (label key, first, corrected, corrected bytes)
    for n in range(CORRECTED_PAIRS):
        stem, pair = f"scene-{n}", scene(7000 + n)
        upload_pair(unkind, batch, stem, pair)
        key = f"incoming/{batch}/labels/{stem}.png"
        # A corrected mask right after the first (a valid mask of the same size, drawn for another scene).
        corrected_label = scene(8000 + n).label
        (first,) = [v for k, v in uploads(unkind) if k == key]
        corrected = upload(unkind, key, corrected_label)
        uploaded.append((key, first, corrected, corrected_label))

    eventually(lambda: landed(unkind), timeout=240, every=2, message="every upload out of the landing zone")
    eventually(lambda: everything_recorded(unkind), timeout=60, message="every upload recorded")

    for key, first, corrected, corrected_label in uploaded:
        curated = key.replace(f"incoming/{batch}/labels/", f"dataset/labels/{batch}/")
        assert curated_body(unkind, curated) == corrected_label, f"{curated} is not the corrected mask"
        assert (fate_of(unkind, key, first), fate_of(unkind, key, corrected)) == ("superseded", "curated"), key
    late = sum(arrived_out_of_order(unkind, key, first, corrected) for key, first, corrected, _ in uploaded)
    print(f"{late} of {CORRECTED_PAIRS} first masks reached the intake after their correction")
    assert late > 0, "the delivery never put a correction first: the test proved nothing (try another DELIVERY_SEED)"
    assert delete_markers(unkind) == [], "a key-level delete hid a newer upload"
    assert queue_depth(unkind, "IntakeDeadLetterQueue") == 0
    assert_audit_is_clean(unkind)
    assert_every_upload_accounted_for_once(unkind)
