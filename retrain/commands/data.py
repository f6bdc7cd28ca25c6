"""`retrain data status` and `retrain data purge KEY...`: look at the data, erase it on request.

Both talk to a deployed stack (`--stack NAME`: the bucket and the ledger table from its outputs),
to the offline stack `retrain local up` runs in another terminal (no flags at all), or to what
`--bucket` / `--ledger-table` (or `DATA_BUCKET` / `LEDGER_TABLE`) and `--endpoint-url` name.
The work itself is in `functions/data/` (`status.py`, `purge.py`).

Exit codes: 0 done; 1 a KEY matched nothing (the others were still erased); 2 usage error
(a missing option, a KEY that names no image, label or pair, a bucket or table that is not
there); 3 the erasure was cut short (run the same command again to finish it).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, NoReturn
from urllib.parse import urlparse

import boto3
import typer
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from rich.console import Console
from rich.table import Table

from functions.common import clients
from functions.data.erasure import PurgeReport, PurgeUsageError
from functions.data.ledger import Ledger
from functions.data.purge import PurgeError, purge
from functions.data.status import DataStatus, data_status
from retrain import target as targets
from retrain.local.stack import FAKE_CREDENTIALS, StackOptions
from retrain.target import StackOption

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_s3 import S3Client

app = typer.Typer(help="Look at the intake's data, and erase images on request.", no_args_is_help=True)
console = Console()
errors = Console(stderr=True)

# Few retries: a person is waiting, and a wrong endpoint should say so within seconds.
CLI_CONFIG = Config(retries={"mode": "standard", "max_attempts": 4}, connect_timeout=5)
LOOPBACK = {"127.0.0.1", "localhost", "::1"}

EndpointOption = Annotated[
    str | None,
    typer.Option(help="AWS endpoint, e.g. the offline stack's (`retrain local up` prints it)."),
]
BucketOption = Annotated[str | None, typer.Option(envvar="DATA_BUCKET", help="The data bucket.", show_default=False)]
LedgerOption = Annotated[
    str | None,
    typer.Option(envvar="LEDGER_TABLE", help="The ledger's DynamoDB table.", show_default=False),
]
RegionOption = Annotated[
    str | None,
    typer.Option(help="AWS region (default: the AWS configuration's; offline: the stack's)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")]


def _fail(message: str, code: int) -> NoReturn:
    errors.print(f"[red]{message}[/red]", soft_wrap=True)
    raise typer.Exit(code)


def _connect(
    endpoint_url: str | None, bucket: str | None, table: str | None, region: str | None, stack: str | None = None
) -> tuple[Ledger, S3Client, str]:
    if stack or not (endpoint_url or bucket or table):
        # No names given: the deployed stack named, or the offline one `retrain local up` runs.
        target = targets.connect(stack, region, errors)
        try:
            bucket, table = target.output("DataBucketName"), target.output("LedgerTableName")
        except targets.TargetError as error:
            _fail(str(error), 2)
        return Ledger(target.client("dynamodb"), table), target.client("s3"), bucket
    if not bucket:
        _fail("no data bucket: pass --bucket or set DATA_BUCKET (or --stack NAME)", 2)
    if not table:
        _fail("no ledger table: pass --ledger-table or set LEDGER_TABLE (or --stack NAME)", 2)
    session = boto3.session.Session(region_name=region)
    credentials = None
    offline = bool(endpoint_url) and urlparse(endpoint_url).hostname in LOOPBACK
    if offline and not session.region_name:
        session = boto3.session.Session(region_name=StackOptions().region)
    if offline and session.get_credentials() is None:
        # The offline stack takes any credentials; botocore still wants some to sign with.
        credentials = (
            FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
    try:
        s3: S3Client = clients.make(
            "s3",
            session=session,
            endpoint_url=endpoint_url,
            config=CLI_CONFIG,
            credentials=credentials,
        )
        dynamodb: DynamoDBClient = clients.make(
            "dynamodb",
            session=session,
            endpoint_url=endpoint_url,
            config=CLI_CONFIG,
            credentials=credentials,
        )
        s3.head_bucket(Bucket=bucket)
        dynamodb.describe_table(TableName=table)
    except NoCredentialsError:
        _fail("no AWS credentials (offline, any will do: AWS_ACCESS_KEY_ID=testing ...)", 2)
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        if code in {"404", "NoSuchBucket"}:
            _fail(f"there is no bucket {bucket} at {endpoint_url or 'AWS'}", 2)
        if code == "ResourceNotFoundException":
            _fail(f"there is no table {table} at {endpoint_url or 'AWS'}", 2)
        _fail(f"cannot reach the data: {error}", 2)
    except BotoCoreError as error:  # no region, endpoint unreachable, ...
        _fail(f"cannot reach the data: {error}", 2)
    errors.print(f"[dim]using bucket {bucket} and table {table} at {endpoint_url or 'AWS'}[/dim]", soft_wrap=True)
    return Ledger(dynamodb, table), s3, bucket


# ----------------------------------------------------------------- status --
@app.command()
def status(
    *,
    stack: StackOption = None,
    endpoint_url: EndpointOption = None,
    bucket: BucketOption = None,
    ledger_table: LedgerOption = None,
    region: RegionOption = None,
    as_json: JsonOption = False,
    batches: Annotated[int, typer.Option(min=0, help="Show the N most recently active batches (0: all).")] = 20,
    versions: Annotated[int, typer.Option(min=0, help="Show the N newest dataset versions (0: all).")] = 5,
) -> None:
    """Batches and what became of their files, pairs waiting for a partner, the retraining
    lock, and the newest dataset versions."""
    ledger, s3, name = _connect(endpoint_url, bucket, ledger_table, region, stack)
    try:
        found = data_status(ledger, s3, name, batches=batches, versions=versions)
    except (ClientError, BotoCoreError) as error:
        _fail(f"cannot read the data: {error}", 2)
    if as_json:
        print(found.model_dump_json(indent=2))
        return
    _print_status(found)


def _when(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S}" if moment else "-"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in counts.items()) or "-"


def _print_status(found: DataStatus) -> None:
    shown = len(found.batches)
    more = f", the {shown} most recently active" if shown < found.batch_count else ""
    table = Table(title=f"Batches ({found.batch_count}{more}; times in UTC)")
    for column in ("batch", "state", "closed by", "first seen", "last seen", "files", "pairs"):
        table.add_column(column)
    for batch in found.batches:
        table.add_row(
            batch.batch,
            batch.status.value,
            batch.closed_by or "-",
            _when(batch.first_seen),
            _when(batch.last_seen),
            _counts(batch.files),
            _counts(batch.pairs),
        )
    console.print(table)
    if found.pending_pairs:
        pending = Table(title=f"Pairs waiting for their partner ({len(found.pending_pairs)})")
        for column in ("batch", "stem", "waiting for", "since"):
            pending.add_column(column)
        for pair in found.pending_pairs:
            pending.add_row(pair.batch, pair.stem, pair.waiting_for, _when(pair.first_seen))
        console.print(pending)
    else:
        console.print("No pair is waiting for its partner.")
    if found.lock is None:
        console.print("Lock: free (no retraining run holds it).")
    else:
        lock = found.lock
        state = "held"
        if lock.expired:
            state = "[yellow]expired[/yellow] (the next trigger takes it over)"
        console.print(
            f"Lock: {state} by {lock.holder}, acquired {_when(lock.acquired_at)}, expires {_when(lock.expires_at)}",
            soft_wrap=True,
        )
    if not found.dataset_versions:
        console.print("No dataset version yet.")
        return
    versions = Table(title=f"Dataset versions ({found.dataset_version_count}, newest first)")
    for column in ("version", "written", "bytes", "erasures"):
        versions.add_column(column)
    for version in found.dataset_versions:
        versions.add_row(
            version.version,
            _when(version.last_modified),
            str(version.size_bytes),
            "entries erased" if version.purged else "-",
        )
    console.print(versions)


# ------------------------------------------------------------------ purge --
@app.command(name="purge")
def purge_command(
    keys: Annotated[
        list[str],
        typer.Argument(
            metavar="KEY",
            help="incoming/<batch>/images/x.jpg, dataset/images/<batch>/x.jpg, "
            "quarantine/<batch>/..., or <batch>/<stem>.",
            show_default=False,
        ),
    ],
    *,
    stack: StackOption = None,
    endpoint_url: EndpointOption = None,
    bucket: BucketOption = None,
    ledger_table: LedgerOption = None,
    region: RegionOption = None,
    as_json: JsonOption = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be erased; change nothing.")] = False,
) -> None:
    """Erase images and their labels everywhere, for erasure requests: every S3 version of the
    landing, curated and quarantine copies, the ledger's items, and their manifest lines.
    Exit 0 done, 1 a KEY matched nothing, 2 usage error, 3 cut short (run it again)."""
    ledger, s3, name = _connect(endpoint_url, bucket, ledger_table, region, stack)
    try:
        report = purge(ledger, s3, name, keys, dry_run=dry_run)
    except PurgeUsageError as error:
        _fail(str(error), 2)
    except (PurgeError, ClientError, BotoCoreError) as error:
        _fail(f"the erasure was cut short: {error}. Run the same command again to finish.", 3)
    if as_json:
        print(report.model_dump_json(indent=2))
    else:
        _print_purge(report)
    if report.remaining:
        raise typer.Exit(3)
    raise typer.Exit(1 if report.unmatched else 0)


def _print_purge(report: PurgeReport) -> None:
    verb = "Would erase" if report.dry_run else "Erased"
    if report.pairs:
        pairs = Table(title=f"{verb}: pairs and files")
        for column in ("batch", "pair or file", "ledger status", "why"):
            pairs.add_column(column)
        for pair in report.pairs:
            pairs.add_row(pair.batch, pair.stem or pair.key or "", pair.status or "-", pair.why)
        console.print(pairs)
        objects = Table(title=f"{verb}: object versions ({len(report.objects)})")
        for column in ("key", "versions", "delete markers"):
            objects.add_column(column)
        versions = Counter(o.key for o in report.objects if not o.delete_marker)
        markers = Counter(o.key for o in report.objects if o.delete_marker)
        for key in sorted(versions.keys() | markers.keys()):
            objects.add_row(key, str(versions[key]), str(markers[key]))
        console.print(objects)
        console.print(f"{verb}: {len(report.ledger_items)} ledger items.")
    for change in report.manifests:
        lines = len(change.entries_removed)
        console.print(
            f"Manifest {change.manifest}: {lines} lines taken out (listed in {change.record}), "
            f"{change.versions_deleted} older versions deleted" + (" (would be)" if report.dry_run else ""),
            soft_wrap=True,
        )
    rewritten = "would be rewritten" if report.dry_run else "rewritten"
    for folder in report.reports:
        console.print(f"Batch report {folder} {rewritten} from the ledger", soft_wrap=True)
    for warning in report.warnings:
        console.print(f"[yellow]{warning}[/yellow]", soft_wrap=True)
    for key in report.unmatched:
        errors.print(f"[red]matched nothing:[/red] {key}", soft_wrap=True)
    for left in report.remaining:
        errors.print(f"[red]still there:[/red] {left.key} ({left.version_id})", soft_wrap=True)
    if report.dry_run:
        console.print("Dry run: nothing was changed.")
