"""`retrain data status`, `retrain data audit` and `retrain data purge KEY...`: look at the data,
check that the bucket, the ledger and the manifests agree, erase it on request. `retrain data
held`, `release`, `hold` and `benchmark`: which pairs' labels are left out of training or judge
the models, and a person's say over it (per pair content; each decision records who made it,
from STS, and the `--reason` it requires).

All three talk to a deployed stack (`--stack NAME`: the bucket and the ledger table from its outputs),
to the offline stack `retrain local up` runs in another terminal (no flags at all), or to what
`--bucket` / `--ledger-table` (or `DATA_BUCKET` / `LEDGER_TABLE`) and `--endpoint-url` name.
The work itself is in `retrain/ops/` (`status.py`, `audit.py`, `purge.py`, `trust.py`).
With `--json` each prints its result as one JSON document on stdout (a trust change: its
`TrustChange`, as the ledger recorded it); what it says in words then goes nowhere.

A purge lists what it will erase and asks before it erases (as the AWS CLI's and SAM's
destructive commands do); `--yes` erases without asking, for scripts, and without `--yes` a purge
whose stdin is no terminal refuses (exit 2) before it reads anything.

Exit codes: 0 done (an audit: clean); 1 a KEY matched nothing (the others were still erased), a
run holds the retraining lock (the purge changed nothing), the question was not answered yes
(nothing erased), the audit found discrepancies, or a
trust change was refused (no such batch, or its pairs' trust does not allow it: nothing changed);
2 usage error (a missing option such as a trust change's --reason, a KEY that names no image,
label, pair or batch, a bucket or table that is not there, a purge without --yes and no terminal);
3 the erasure was cut short (run the same command again to finish it).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, NoReturn
from urllib.parse import urlparse

import boto3
import typer
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table

from functions.common import clients
from functions.data.ledger import Ledger
from functions.data.models import BatchStatus, LockRecord, Trust
from functions.data.reports import NEW, write_report
from functions.data.run_lock import Executions
from functions.data.storage import DataBucket
from retrain import target as targets
from retrain.commands.options import JsonOption, print_json
from retrain.ops.audit import DEFAULT_GRACE_SECONDS, KIND_TITLES, AuditReport, AuditUsageError, Kind, audit
from retrain.ops.erasure import PurgeReport, PurgeUsageError
from retrain.ops.purge import LockHeldError, PurgeError, purge, trust_item
from retrain.ops.status import DataStatus, data_status
from retrain.ops.trust import (
    MEANINGS,
    ReasonRequiredError,
    TrustChange,
    TrustEntry,
    TrustOverview,
    TrustRefusedError,
    caller_identity,
    hold_batch,
    make_benchmark,
    release_batch,
    trust_overview,
    undo_benchmark,
)
from retrain.target import StackOption

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sts import STSClient

app = typer.Typer(
    help="Look at the intake's data, check that bucket and ledger agree, erase images on request, "
    "and decide which batches' labels are trained on.",
    no_args_is_help=True,
)
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


@dataclass(frozen=True)
class Connection:
    """Where the data is, as a command's connection options name it (`_connect` resolves it)."""

    stack: StackOption = None
    endpoint_url: EndpointOption = None
    bucket: BucketOption = None
    ledger_table: LedgerOption = None
    region: RegionOption = None

    @property
    def named(self) -> bool:
        """The bucket, table or endpoint were named by hand, not found in a stack's outputs."""
        return bool(self.endpoint_url or self.bucket or self.ledger_table)


def connection_options(command: Callable[..., None]) -> Callable[..., None]:
    """The command with `Connection`'s fields as its options, where its `connection` parameter
    stands, and called with them gathered into that one `Connection`.

    Typer reads a command's options from its signature, so the options are declared once (the
    fields above, with their names, environment variables and help) and every data command gets
    the same ones, in the same place in its --help as it declares `connection`."""
    signature = inspect.signature(command, eval_str=True)
    annotations = inspect.get_annotations(Connection, eval_str=True)
    options = [
        inspect.Parameter(
            field.name, inspect.Parameter.KEYWORD_ONLY, default=field.default, annotation=annotations[field.name]
        )
        for field in fields(Connection)
    ]
    parameters = list(signature.parameters.values())
    at = [parameter.name for parameter in parameters].index("connection")
    parameters[at : at + 1] = options

    @functools.wraps(command)
    def with_connection(*args: Any, **kwargs: Any) -> None:
        connection = Connection(**{option.name: kwargs.pop(option.name) for option in options})
        command(*args, connection=connection, **kwargs)

    # Typer reads both: the signature for the parameters, the annotations for their types.
    with_connection.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    with_connection.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
    return with_connection


def _fail(message: str, code: int) -> NoReturn:
    errors.print(f"[red]{message}[/red]", soft_wrap=True)
    raise typer.Exit(code)


def _connect(connection: Connection) -> tuple[Ledger, S3Client, str]:
    stack, endpoint_url, region = connection.stack, connection.endpoint_url, connection.region
    bucket, table = connection.bucket, connection.ledger_table
    if stack or not connection.named:
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
    session, credentials = _signing(endpoint_url, region)
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


def _signing(endpoint_url: str | None, region: str | None) -> tuple[boto3.session.Session, tuple[str, str] | None]:
    """The session for names given by hand, and the credentials to sign with when they are not
    the configured ones: the offline stack takes any, and botocore still wants some."""
    offline = bool(endpoint_url) and urlparse(endpoint_url).hostname in LOOPBACK
    session = boto3.session.Session(region_name=region)
    if offline and not session.region_name:
        session = boto3.session.Session(region_name=targets.OFFLINE_REGION)
    return session, targets.OFFLINE_CREDENTIALS if offline and session.get_credentials() is None else None


# ----------------------------------------------------------------- status --
@app.command()
@connection_options
def status(
    *,
    connection: Connection,
    as_json: JsonOption = False,
    batches: Annotated[int, typer.Option(min=0, help="Show the N most recently active batches (0: all).")] = 20,
    versions: Annotated[int, typer.Option(min=0, help="Show the N newest dataset versions (0: all).")] = 5,
) -> None:
    """Batches, their labels' trust and what became of their files, pairs waiting for a partner,
    the retraining lock, and the newest dataset versions."""
    ledger, s3, name = _connect(connection)
    try:
        found = data_status(ledger, s3, name, batches=batches, versions=versions)
    except (ClientError, BotoCoreError) as error:
        _fail(f"cannot read the data: {error}", 2)
    if as_json:
        print_json(found)
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
    for column in ("batch", "state", "trust", "closed by", "first seen", "last seen", "files", "pairs"):
        table.add_column(column)
    for batch in found.batches:
        table.add_row(
            batch.batch,
            batch.status.value,
            # "held" alone or "3 held, 40 trusted": any held pair is worth a look.
            f"[yellow]{batch.trust}[/yellow]" if Trust.HELD in batch.trust else batch.trust,
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


# ------------------------------------------------------------------ audit --
@app.command(name="audit")
@connection_options
def audit_command(
    *,
    connection: Connection,
    as_json: JsonOption = False,
    grace_seconds: Annotated[
        int,
        typer.Option(
            min=0,
            help="Objects and pending records younger than this are listed as too recent to judge "
            "(the intake may be working on them), not as discrepancies.",
        ),
    ] = DEFAULT_GRACE_SECONDS,
) -> None:
    """Check that every object version in incoming/, dataset/ and quarantine/ has exactly one
    fate in the ledger, that every ledger record names an object that is there, that every
    manifest line pins bytes with the sha256 it records, and that no duplicate-detection claim
    names an erased file. Reads only. Exit 0 clean, 1 discrepancies, 2 usage or connection error."""
    ledger, s3, name = _connect(connection)
    try:
        with _hash_bar() as bar:
            report = audit(ledger, s3, name, grace_seconds=grace_seconds, progress=bar)
    except AuditUsageError as error:
        _fail(str(error), 2)
    except (ClientError, BotoCoreError) as error:
        _fail(f"cannot read the data: {error}", 2)
    if as_json:
        print_json(report)
    else:
        _print_audit(report)
    raise typer.Exit(0 if report.clean else 1)


class _HashBar:
    """The audit's `HashProgress`: a bar on stderr (stdout stays clean for --json)."""

    def __init__(self, bar: Progress) -> None:
        self._bar = bar
        self._task: TaskID | None = None

    def begin(self, objects: int, total_bytes: int) -> None:
        self._task = self._bar.add_task(f"hashing {objects} object versions", total=total_bytes)

    def advance(self, read_bytes: int) -> None:
        if self._task is not None:
            self._bar.advance(self._task, read_bytes)


@contextmanager
def _hash_bar() -> Iterator[_HashBar]:
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=errors,
        transient=True,
        disable=not errors.is_terminal,
    )
    with bar:
        yield _HashBar(bar)


def _print_audit(report: AuditReport) -> None:
    checked = report.checked
    console.print(
        f"Audited {report.bucket} at {_when(report.at)} UTC: {checked.object_versions} object versions, "
        f"{checked.file_records} file records, {checked.pairs} pairs, {checked.claims} content claims, "
        f"{checked.manifest_lines} lines of {checked.manifests} manifests "
        f"({checked.objects_hashed} object versions, {checked.bytes_hashed} bytes hashed).",
        soft_wrap=True,
    )
    if checked.held_pairs:
        console.print(
            f"{_pairs(checked.held_pairs)} held in {_batches(checked.held_batches)} (`retrain data held`): "
            "curated, and in no dataset version frozen since they were held: not a discrepancy.",
            soft_wrap=True,
        )
    if checked.expired_by_lifecycle:
        console.print(
            f"{checked.expired_by_lifecycle} recorded versions under quarantine/ are gone as the bucket's "
            "lifecycle rule removes superseded versions (NoncurrentVersionDays): not a discrepancy."
        )
    for kind in Kind:
        found = [d for d in report.discrepancies if d.kind is kind]
        if not found:
            continue
        table = Table(title=f"{KIND_TITLES[kind]} ({kind.value}: {len(found)})", title_justify="left")
        # Keys whole (an engineer copies them into the next command); the version under its key.
        table.add_column("object or item (version)", no_wrap=True)
        table.add_column("what is wrong")
        for discrepancy in found:
            table.add_row(_with_version(discrepancy.subject, discrepancy.version), escape(discrepancy.detail))
        console.print(table)
    if report.too_recent:
        waiting = Table(
            title=f"Too recent to judge (younger than {report.grace_seconds} s: {len(report.too_recent)})",
            title_justify="left",
        )
        waiting.add_column("object or item (version)", no_wrap=True)
        waiting.add_column("since")
        waiting.add_column("state")
        for recent in report.too_recent:
            waiting.add_row(_with_version(recent.subject, recent.version), _when(recent.at), escape(recent.detail))
        console.print(waiting)
    if report.clean:
        console.print("[green]Clean:[/green] bucket, ledger and manifests agree.")
    else:
        count, kinds = len(report.discrepancies), len({d.kind for d in report.discrepancies})
        console.print(
            f"[red]{count} {'discrepancy' if count == 1 else 'discrepancies'}[/red] "
            f"of {kinds} {'kind' if kinds == 1 else 'kinds'}."
        )


def _with_version(subject: str, version: str | None) -> str:
    return f"{escape(subject)}\n[dim]{escape(version)}[/dim]" if version else escape(subject)


# ------------------------------------------------------------------ purge --
_STATE_MACHINE_ARN = re.compile(r"^arn:aws[a-z-]*:states:[a-z0-9-]+:\d{12}:stateMachine:[^:\s]+$")


def _state_machine_arn(value: str | None) -> str | None:
    """--state-machine-arn's shape, checked first: a wrong one would otherwise fail only when a lock
    is to be judged, mid-purge, as an AWS error."""
    if value is not None and not _STATE_MACHINE_ARN.match(value):
        raise typer.BadParameter(
            f"{value!r} is not a state machine's ARN (arn:aws:states:<region>:<account>:stateMachine:<name>)"
        )
    return value


@app.command(name="purge")
@connection_options
def purge_command(
    keys: Annotated[
        list[str],
        typer.Argument(
            metavar="KEY",
            help="incoming/<batch>/images/x.jpg, dataset/images/<batch>/x.jpg, "
            "quarantine/<batch>/..., <batch>/<stem>, or <batch>/ (the whole batch, its trust item too).",
            show_default=False,
        ),
    ],
    *,
    connection: Connection,
    as_json: JsonOption = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be erased; change nothing.")] = False,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes",
            "-y",
            help="Erase without asking (scripts). Without it the command lists what it will erase and asks, "
            "and refuses when stdin is no terminal.",
        ),
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="If a run holds the retraining lock, wait until it ends (not refuse).")
    ] = False,
    state_machine_arn: Annotated[
        str | None,
        typer.Option(
            envvar="STATE_MACHINE_ARN",
            callback=_state_machine_arn,
            help="The retraining state machine, to tell a lock whose run has ended from one still running "
            "(default: from --stack's outputs; without it an unexpired lock counts as held).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Erase images and their labels everywhere, for erasure requests or a held batch nobody
    wants: every S3 version of the landing, curated and quarantine copies, the pictures of its
    relabel list, the ledger's items (a whole batch's trust item too), and their manifest lines. Holds
    the retraining lock while it erases, so no dataset version is frozen meanwhile.
    Lists what it will erase and asks first (--yes: does not ask).
    Exit 0 done, 1 a KEY matched nothing, a run holds the lock or the question was not answered yes
    (nothing changed), 2 usage error, 3 cut short (run it again)."""
    asking = not (dry_run or yes)
    if asking and not sys.stdin.isatty():
        _fail(
            "retrain data purge asks before it erases, and stdin is no terminal to answer on: pass --yes to "
            "erase without asking (--dry-run shows what it would erase); nothing was erased",
            2,
        )
    ledger, s3, name = _connect(connection)
    runs = _runs(state_machine_arn, connection)
    seen: set[str] = set()

    def waiting(lock: LockRecord) -> None:
        if lock.holder not in seen:
            seen.add(lock.holder)
            errors.print(f"waiting for {lock.holder} to release the retraining lock ...", soft_wrap=True)

    def erase(dry: bool, *, planning: bool = False) -> PurgeReport:
        try:
            return purge(ledger, s3, name, keys, dry_run=dry, runs=runs, wait=wait, on_wait=waiting)
        except PurgeUsageError as error:
            _fail(str(error), 2)
        except LockHeldError as error:
            _fail(str(error), 1)
        except (PurgeError, ClientError, BotoCoreError) as error:
            if planning:
                _fail(f"cannot list what to erase: {error}; nothing was erased", 2)
            _fail(f"the erasure was cut short: {error}. Run the same command again to finish.", 3)

    plan = erase(dry=True, planning=True) if asking else None
    if plan is not None:
        # The plan is the dry run's; the erasure looks again under the lock (and says what it erased).
        say = errors if as_json else console
        if not _erases_anything(plan):
            _print_purge(plan, out=say, planned=True)
            raise typer.Exit(1 if plan.unmatched else 0)
        _print_purge(plan, out=say, planned=True)
        if not _confirmed(plan):
            _fail("nothing was erased", 1)
    report = erase(dry=dry_run)
    if as_json:
        print_json(report)
    else:
        _print_purge(report)
        if plan is not None:
            _say_what_else(plan, report)
    if report.remaining:
        raise typer.Exit(3)
    raise typer.Exit(1 if report.unmatched else 0)


def _erases_anything(plan: PurgeReport) -> bool:
    return bool(plan.objects or plan.ledger_items or plan.manifests)


def _confirmed(plan: PurgeReport) -> bool:
    """The question, on stderr (stdout may carry --json's document); no answer is no."""
    versions = sorted({change.dataset_version for change in plan.manifests})
    what = [_many(len(plan.objects), "object version"), _many(len(plan.ledger_items), "ledger item")]
    if versions:
        lines = sum(len(change.entries_removed) for change in plan.manifests)
        what.append(f"{_many(lines, 'line')} of {_many(len(versions), 'dataset version')}")
        errors.print(f"Dataset versions affected: {', '.join(versions)}", soft_wrap=True, highlight=False)
    try:
        # click writes the prompt's last character to stdout (a readline workaround): on stderr
        # too, so that stdout stays --json's one document.
        with contextlib.redirect_stdout(sys.stderr):
            return typer.confirm(f"Erase these {', '.join(what[:-1])} and {what[-1]} for good?", err=True)
    except typer.Abort:  # end of input, or Ctrl-C, at the question
        errors.print("")
        return False


def _many(count: int, thing: str) -> str:
    return f"{count} {thing}{'' if count == 1 else 's'}"


def _say_what_else(plan: PurgeReport, report: PurgeReport) -> None:
    """What the erasure found under the lock that the list it asked about did not hold (written since)."""
    listed = {(o.key, o.version_id) for o in plan.objects}
    more = [o for o in report.objects if (o.key, o.version_id) not in listed]
    if more:
        console.print(
            f"{len(more)} object versions written since the list above were erased too (listed with the rest).",
            soft_wrap=True,
        )


def _runs(state_machine_arn: str | None, connection: Connection) -> Executions | None:
    """Step Functions, to ask whether the run holding the lock still runs: the state machine
    named, or the stack's (deployed, or the offline one when no names were given)."""
    stack, endpoint_url, region = connection.stack, connection.endpoint_url, connection.region
    if state_machine_arn:
        session, credentials = _signing(endpoint_url, region)
        sfn = clients.make(
            "stepfunctions", session=session, endpoint_url=endpoint_url, config=CLI_CONFIG, credentials=credentials
        )
        return Executions(sfn, state_machine_arn)
    if connection.named and not stack:
        return None
    try:
        # `_connect` resolved it a moment ago and said which: this look is silent.
        target = targets.resolve(stack, region)
    except targets.TargetError:
        return None
    found = target.outputs.get("RetrainStateMachineArn")
    return Executions(target.client("stepfunctions"), found) if found else None


def _print_purge(report: PurgeReport, out: Console = console, *, planned: bool = False) -> None:
    """The report in tables and lines; `planned`: the list a purge asks about before it erases."""
    verb = "Will erase" if planned else "Would erase" if report.dry_run else "Erased"
    if report.pairs:
        pairs = Table(title=f"{verb}: pairs and files")
        for column in ("batch", "pair or file", "ledger status", "why"):
            pairs.add_column(column)
        for pair in report.pairs:
            pairs.add_row(pair.batch, pair.stem or pair.key or "", pair.status or "-", pair.why)
        out.print(pairs)
        objects = Table(title=f"{verb}: object versions ({len(report.objects)})")
        for column in ("key", "versions", "delete markers"):
            objects.add_column(column)
        versions = Counter(o.key for o in report.objects if not o.delete_marker)
        markers = Counter(o.key for o in report.objects if o.delete_marker)
        for key in sorted(versions.keys() | markers.keys()):
            objects.add_row(key, str(versions[key]), str(markers[key]))
        out.print(objects)
        out.print(f"{verb}: {len(report.ledger_items)} ledger items.")
    for batch in report.batches:
        gone = trust_item(batch) in report.ledger_items
        trust = " with its trust item (`retrain data held` no longer lists it)" if gone else ""
        out.print(f"{verb} the whole batch {batch}{trust}.", soft_wrap=True)
    mood = " (will be)" if planned else " (would be)" if report.dry_run else ""
    for change in report.manifests:
        lines = len(change.entries_removed)
        out.print(
            f"Manifest {change.manifest}: {lines} lines taken out (listed in {change.record}), "
            f"{change.versions_deleted} older versions deleted{mood}",
            soft_wrap=True,
        )
    rewritten = "will be rewritten" if planned else "would be rewritten" if report.dry_run else "rewritten"
    for folder in report.reports:
        out.print(f"Batch report {folder} {rewritten} from the ledger", soft_wrap=True)
    for warning in report.warnings:
        out.print(f"[yellow]{warning}[/yellow]", soft_wrap=True)
    for key in report.unmatched:
        errors.print(f"[red]matched nothing:[/red] {key}", soft_wrap=True)
    for left in report.remaining:
        errors.print(f"[red]still there:[/red] {left.key} ({left.version_id})", soft_wrap=True)
    if report.dry_run and not planned:
        out.print("Dry run: nothing was changed.")


# ------------------------------------------------------------------ trust --
BatchArgument = Annotated[str, typer.Argument(metavar="BATCH", help="The batch's name.", show_default=False)]
ReasonOption = Annotated[
    str | None,
    typer.Option(
        "--reason",
        metavar="TEXT",
        help="Why (required): kept with the decision and who made it, shown by `retrain data held` "
        "and the batch's report.",
        show_default=False,
    ),
]


@app.command()
@connection_options
def held(
    *,
    connection: Connection,
    as_json: JsonOption = False,
) -> None:
    """Batches with pairs held out of every dataset version (by a run's screening or a person),
    with who decided, when and why; batches with released pairs; the team's benchmark."""
    ledger, _, _ = _connect(connection)
    try:
        found = trust_overview(ledger)
    except (ClientError, BotoCoreError) as error:
        _fail(f"cannot read the ledger: {error}", 2)
    if as_json:
        print_json(found)
        return
    _print_held(found)


def _print_held(found: TrustOverview) -> None:
    # Lines, not a table: run names, identities and reasons stay whole, to be read and copied.
    if found.held:
        _print_trusts(found.held, MEANINGS[Trust.HELD], "held")
        console.print(
            "Let a batch's held pairs in with `retrain data release BATCH --reason TEXT`, have its team upload "
            "corrected labels (a new pair, screened again), or erase it with `retrain data purge BATCH/`.",
            soft_wrap=True,
        )
    else:
        console.print("No pair is held: every curated pair is in the next dataset version.")
    if found.released:
        _print_trusts(found.released, MEANINGS[Trust.RELEASED], "released")
    if found.benchmark:
        _print_trusts(found.benchmark, MEANINGS[Trust.BENCHMARK], "benchmark")
    console.print(
        f"With trusted pairs: {_batches(found.trusted)}. With no verdict yet: {_batches(found.new)}. "
        "(`retrain data status` shows every batch's trust.)",
        soft_wrap=True,
    )


def _print_trusts(entries: list[TrustEntry], meaning: str, title: str) -> None:
    console.print(f"[bold]{title.capitalize()} ({len(entries)})[/bold]: {meaning}.", soft_wrap=True)
    for entry in entries:
        console.print(
            f"  [bold]{escape(entry.batch)}[/bold]: {escape(entry.pairs.summary())} "
            f"(of {_pairs(entry.pairs.total)} curated)",
            soft_wrap=True,
        )
        if entry.last is not None:
            last = entry.last
            console.print(
                f"    last: {escape(last.verdict)} by {escape(last.by)}, {_when(last.at)} UTC, {_pairs(last.pairs)}",
                soft_wrap=True,
                highlight=False,
            )
            for reason in last.reasons:
                console.print(f"    - {escape(reason)}", soft_wrap=True, highlight=False)
        if entry.run_report and title == "held":
            console.print(f"    what screening found: {escape(entry.run_report)}report.html", soft_wrap=True)
        if entry.to_fix and title == "held":
            console.print(f"    {_pairs(entry.to_fix)} to fix, worst first: {escape(entry.report)}", soft_wrap=True)


def _batches(count: int) -> str:
    return f"{count} {'batch' if count == 1 else 'batches'}"


def _pairs(count: int) -> str:
    return f"{count} {'pair' if count == 1 else 'pairs'}"


def _are(count: int) -> str:
    return "is" if count == 1 else "are"


@app.command()
@connection_options
def release(
    batch: BatchArgument,
    *,
    reason: ReasonOption = None,
    connection: Connection,
    as_json: JsonOption = False,
) -> None:
    """Let a batch's held pairs in (their labels are right after all): the next run trains on
    them; they are still screened and reported, and never held again automatically. Requires
    --reason; you are recorded as the one who decided. Exit 1: no such batch, or no held pair."""
    why = _reason(reason)
    ledger, s3, name = _connect(connection)
    by = _caller(connection)
    change = _change(lambda: release_batch(ledger, batch, reason=why, by=by))
    _rewrite_report(ledger, s3, name, batch)
    if as_json:
        print_json(change)
        return
    console.print(
        f"Released {_pairs(change.decision.pairs)} of {escape(batch)}, decided by {escape(by)}: the next run "
        f"includes them ({MEANINGS[Trust.RELEASED]}); {_pairs(change.offered)} {_are(change.offered)} new data "
        "again, so the trigger starts that run by its usual rule.",
        soft_wrap=True,
        highlight=False,
    )
    if change.running:
        console.print(
            f"Run {change.running}, running now, keeps what it has: the release counts from the next run.",
            soft_wrap=True,
        )


@app.command()
@connection_options
def hold(
    batch: BatchArgument,
    *,
    reason: ReasonOption = None,
    connection: Connection,
    as_json: JsonOption = False,
) -> None:
    """Hold a batch's current pairs by hand: every dataset version from the next run on leaves
    them out, until their labels are fixed (a new label is a new pair, screened again) or they
    are released or purged. Pairs added later are new, and screened. Requires --reason; you are
    recorded as the one who decided. Exit 1: no such batch, every pair held already, or a benchmark."""
    why = _reason(reason)
    ledger, s3, name = _connect(connection)
    by = _caller(connection)
    change = _change(lambda: hold_batch(ledger, batch, reason=why, by=by))
    _rewrite_report(ledger, s3, name, batch)
    if as_json:
        print_json(change)
        return
    console.print(
        f"Held {_pairs(change.decision.pairs)} of {escape(batch)} (they were: {change.before.summary()}), decided by "
        f"{escape(by)}: every run from the next on leaves them out of its dataset version, until their labels "
        "are fixed, `retrain data release` or `retrain data purge`. Pairs uploaded to it later are new, and "
        "screened.",
        soft_wrap=True,
        highlight=False,
    )
    running = f" (run {change.running} holds the retraining lock now)" if change.running else ""
    console.print(
        f"A run already running still uses them{running}: its dataset version was frozen before.", soft_wrap=True
    )


@app.command()
@connection_options
def benchmark(
    batch: BatchArgument,
    *,
    reason: ReasonOption = None,
    checked_by_hand: Annotated[
        bool,
        typer.Option(
            "--checked-by-hand",
            help="I checked these labels by hand: name pairs no screening trusted yet (recorded with the decision).",
        ),
    ] = False,
    undo: Annotated[
        bool, typer.Option("--undo", help="Make a batch's benchmark pairs new again (screened, trained on).")
    ] = False,
    connection: Connection,
    as_json: JsonOption = False,
) -> None:
    """Name a batch's current pairs the team's benchmark: never trained on, always in the quality
    gate, from the next run on. Only trusted pairs (screened and passed by an independent
    judgement), or with --checked-by-hand. Requires --reason; you are recorded as the one who
    decided. Exit 1: no such batch, a held pair (release it first), pairs not trusted without
    --checked-by-hand, or a benchmark already (with --undo: it is not one)."""
    why = _reason(reason)
    ledger, s3, name = _connect(connection)
    by = _caller(connection)
    if undo:
        undone = _change(lambda: undo_benchmark(ledger, batch, reason=why, by=by))
        _rewrite_report(ledger, s3, name, batch)
        if as_json:
            print_json(undone)
            return
        console.print(
            f"{_pairs(undone.decision.pairs)} of {escape(batch)} {_are(undone.decision.pairs)} new again, decided by "
            f"{escape(by)}: {MEANINGS[NEW]}.",
            soft_wrap=True,
            highlight=False,
        )
        return
    change = _change(lambda: make_benchmark(ledger, batch, reason=why, by=by, checked_by_hand=checked_by_hand))
    _rewrite_report(ledger, s3, name, batch)
    if as_json:
        print_json(change)
        return
    how = "checked by hand" if checked_by_hand else "every pair trusted by screening"
    console.print(
        f"{_pairs(change.decision.pairs)} of {escape(batch)} {_are(change.decision.pairs)} part of the team's "
        f"benchmark from the next run on ({how}), decided by {escape(by)}: never trained on, always in the quality "
        "gate.",
        soft_wrap=True,
        highlight=False,
    )
    if change.before.trusted or change.before.released:
        console.print(
            "Models trained until now saw their labels: until a model trained without them is accepted, "
            "the accepted model's benchmark scores flatter it.",
            soft_wrap=True,
        )


def _reason(reason: str | None) -> str:
    """The reason a trust change requires, or exit 2 before anything is touched."""
    if reason is None or not reason.strip():
        _fail(
            "--reason TEXT is required: say why (it is kept with the decision and who made it, and shown by "
            "`retrain data held` and the batch's report); nothing was changed",
            2,
        )
    return reason.strip()


def _caller(connection: Connection) -> str:
    """Who runs the command, as AWS knows them (STS GetCallerIdentity, which any credentials may
    call): recorded with every trust decision. The same stack or endpoint as `_connect`."""
    stack, endpoint_url, region = connection.stack, connection.endpoint_url, connection.region
    try:
        if connection.named and not stack:
            session, credentials = _signing(endpoint_url, region)
            sts: STSClient = clients.make(
                "sts", session=session, endpoint_url=endpoint_url, config=CLI_CONFIG, credentials=credentials
            )
        else:
            # `_connect` resolved it a moment ago and said which: this look is silent.
            sts = targets.resolve(stack, region).client("sts")
        return caller_identity(sts)
    except targets.TargetError as error:
        _fail(str(error), 2)
    except NoCredentialsError:
        _fail("no AWS credentials: a trust decision records who made it", 2)
    except (ClientError, BotoCoreError) as error:
        _fail(f"cannot tell who you are (STS GetCallerIdentity): {error}; nothing was changed", 2)


def _rewrite_report(ledger: Ledger, s3: S3Client, bucket: str, batch: str) -> None:
    """The team reads its batch's report: rewrite it from the ledger after a decision (a closed
    batch's only: an open one gets its report when it closes). A failure leaves the decision
    standing; the next intake or run rewrites the report anyway."""
    try:
        found = ledger.batch(batch)
        if found is not None and found[0].status is BatchStatus.CLOSED:
            write_report(batch, ledger, DataBucket(s3, bucket))
    except (ClientError, BotoCoreError) as error:
        errors.print(
            f"[yellow]the decision is recorded, but the batch report was not rewritten: {error}[/yellow]",
            soft_wrap=True,
        )


def _change(work: Callable[[], TrustChange]) -> TrustChange:
    """A person's trust change: refused (exit 1, nothing changed) or failed (exit 2) said plainly."""
    try:
        return work()
    except ReasonRequiredError as error:
        _fail(f"{error}: nothing was changed", 2)
    except TrustRefusedError as error:
        _fail(f"{error}: nothing was changed", 1)
    except (ClientError, BotoCoreError) as error:
        _fail(f"cannot change the ledger: {error}", 2)
