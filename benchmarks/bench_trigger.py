"""The trigger's reads against the history: what one look costs with 10 and 1,000 past batches.

    .venv/bin/python benchmarks/bench_trigger.py [--small 10] [--large 1000] [--pairs-per-batch 4]

Run from the repository root. Under moto (mock_aws), a ledger table made as template.yaml's
LedgerTable is seeded with past batches that runs have consumed (closed, every curated pair in a
dataset version), plus one settled batch holding a few new pairs (below MinNewPairs: the trigger
waits) and one open batch. Then the trigger's decision path runs once (`Trigger.run`, the real
code on the real ledger), and a botocore `after-call.dynamodb.*` hook counts its DynamoDB read
calls (GetItem, Query, Scan, BatchGetItem, every page) and the items they returned. Prints:
- `trigger_reads_<n>_batches`, `trigger_items_read_<n>_batches`: calls and items of one look;
- `trigger_reads_ratio`, `trigger_items_read_ratio`: the large history over the small (target:
  about 1);
- `unconsumed_items_read_ratio`: the same queries the trigger made before batches were consumed
  (every closed batch, every curated pair), large history over small: what the ratio was.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import boto3
from moto import mock_aws

from functions.data.ledger import Ledger
from functions.data.models import BatchStatus, PairRecord, PairStatus
from functions.data.storage import DataBucket
from functions.trigger.logic import Trigger, TriggerPolicy
from functions.validation import DEFAULT_CONFIG
from retrain.local.cloudformation.stack import create_ledger_table

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

REGION = "us-east-1"
TABLE = "ledger"
BUCKET = "bench-trigger-data"
NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
READS = {"GetItem", "Query", "Scan", "BatchGetItem"}
NEW_PAIRS = 5  # in the one settled batch no run has seen: fewer than MinNewPairs


def metric(name: str, value: object) -> None:
    print(f"{name}: {value}", flush=True)


@dataclass
class ReadCounter:
    calls: int = 0
    items: int = 0

    def __call__(self, model: Any, parsed: dict[str, Any], **_: Any) -> None:
        if model.name not in READS:
            return
        self.calls += 1
        if model.name == "GetItem":
            self.items += 1 if parsed.get("Item") else 0
        elif model.name == "BatchGetItem":
            self.items += sum(len(items) for items in parsed.get("Responses", {}).values())
        else:
            self.items += int(parsed.get("Count", 0))


@contextmanager
def counting(client: DynamoDBClient) -> Iterator[ReadCounter]:
    counter = ReadCounter()
    client.meta.events.register("after-call.dynamodb.*", counter)
    try:
        yield counter
    finally:
        client.meta.events.unregister("after-call.dynamodb.*", counter)


def create_ledger(dynamodb: DynamoDBClient) -> Ledger:
    create_ledger_table(dynamodb, TABLE)
    return Ledger(dynamodb, TABLE)


def closed_batch(ledger: Ledger, name: str, at: datetime, pairs: int, version: str | None) -> None:
    """A batch of `pairs` curated pairs, closed by its marker; with `version`, consumed by that run."""
    ledger.touch_batch(name, at)
    for index in range(pairs):
        pair = PairRecord(batch=name, stem=f"{index:04d}", status=PairStatus.VALID, first_seen=at)
        ledger.put_pair(pair.model_copy(update={"dataset_version": version}), 1)
    found = ledger.batch(name)
    assert found is not None
    record, revision = found
    closed = record.model_copy(update={"status": BatchStatus.CLOSED, "closed_at": at, "close_reason": "marker"})
    ledger.close_batch(closed, revision)
    if version is not None:
        ((seen, now_revision),) = [(b, r) for b, r in ledger.closed_batches() if b.batch == name]
        if not ledger.consume_batch(seen, now_revision):
            raise SystemExit(f"bench_trigger: could not consume {name}")


def one_look(past: int, pairs_per_batch: int) -> tuple[ReadCounter, ReadCounter, str]:
    """(the trigger's reads, the reads of the queries it made before consumption, its reason)."""
    with mock_aws():
        dynamodb = boto3.client("dynamodb", region_name=REGION)
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        ledger = create_ledger(dynamodb)
        for index in range(past):
            at = NOW - timedelta(days=30) + timedelta(minutes=index)
            closed_batch(ledger, f"past-{index:05d}", at, pairs_per_batch, version=f"ds-past-{index:05d}")
        closed_batch(ledger, "current", NOW - timedelta(hours=1), NEW_PAIRS, version=None)
        ledger.touch_batch("still-open", NOW - timedelta(minutes=1))
        trigger = Trigger(
            ledger=ledger,
            bucket=DataBucket(s3, BUCKET),
            sfn=boto3.client("stepfunctions", region_name=REGION),
            state_machine_arn=f"arn:aws:states:{REGION}:123456789012:stateMachine:retrain",
            taxonomy=DEFAULT_CONFIG.taxonomy,
            policy=TriggerPolicy(),
            clock=lambda: NOW,
        )
        with counting(dynamodb) as reads:
            outcome = trigger.run()
        if outcome.started is not None:
            raise SystemExit(f"bench_trigger: a run started: {outcome}")
        with counting(dynamodb) as before:
            # What the trigger read before consumption: every closed batch, every curated pair.
            ledger.batches()
            ledger.valid_pairs()
        return reads, before, outcome.reason


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=10, help="past consumed batches, the small history")
    parser.add_argument("--large", type=int, default=1000, help="past consumed batches, the large history")
    parser.add_argument("--pairs-per-batch", type=int, default=4, help="curated pairs in each past batch")
    args = parser.parse_args()
    started = time.monotonic()
    small, small_before, reason = one_look(args.small, args.pairs_per_batch)
    large, large_before, _ = one_look(args.large, args.pairs_per_batch)
    metric("trigger_decision", reason)
    metric(f"trigger_reads_{args.small}_batches", small.calls)
    metric(f"trigger_items_read_{args.small}_batches", small.items)
    metric(f"trigger_reads_{args.large}_batches", large.calls)
    metric(f"trigger_items_read_{args.large}_batches", large.items)
    metric("trigger_reads_ratio", f"{large.calls / small.calls:.2f}")
    metric("trigger_items_read_ratio", f"{large.items / small.items:.2f}")
    metric("unconsumed_items_read_ratio", f"{large_before.items / small_before.items:.2f}")
    metric("bench_seconds", f"{time.monotonic() - started:.0f}")


if __name__ == "__main__":
    main()
