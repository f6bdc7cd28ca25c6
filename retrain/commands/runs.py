"""`retrain runs list|show|start|rerun|cancel`: see and steer the retraining runs of a stack.

Without `--stack` they talk to the offline stack that `retrain local up` runs in another terminal;
with `--stack NAME`, to a deployed stack (names and ARNs from its outputs). The work is in
`retrain/runs.py`.

Exit codes: 0 done; 1 nothing to do (a start or rerun refused because a run holds the lock or, for
a start, there is no new data; a cancel of a run that has ended); 2 no such run, no stack, AWS
unreachable, or the trigger function failed.
"""

from __future__ import annotations

import getpass
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, NoReturn

import typer
from aws_lambda_powertools.utilities.parameters import SecretsProvider
from botocore.exceptions import BotoCoreError, ClientError
from rich.console import Console
from rich.table import Table

from functions.common import prefixes
from functions.common.requests import TriggerOutcome
from functions.common.taxonomy import DEFAULT_TAXONOMY
from functions.data.ledger import Ledger
from functions.data.storage import DataBucket
from functions.notify import render
from functions.notify.links import run_links
from functions.notify.logic import Notifier
from functions.notify.secret import SlackWebhookSecret
from functions.trigger.logic import Trigger, TriggerPolicy
from retrain import target as targets
from retrain.commands.checks import finite, run_name
from retrain.commands.options import JsonOption
from retrain.runs import RunNotFoundError, RunNotRunningError, Runs, TriggerFailedError, release_through, start_now
from retrain.target import RegionOption, StackOption, StackTarget, TargetError

app = typer.Typer(help="See and steer retraining runs: list, show, start, rerun, cancel.", no_args_is_help=True)
console = Console()
errors = Console(stderr=True)

RunArgument = Annotated[
    str, typer.Argument(callback=run_name, help="The run: its execution name, as `retrain runs list` shows it.")
]


def _fail(message: str, code: int) -> NoReturn:
    errors.print(f"[red]{message}[/red]", soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def _talking_to(target: StackTarget) -> Iterator[None]:
    """Expected conditions in words: a missing output, an unreachable or refusing AWS."""
    try:
        yield
    except TargetError as error:
        _fail(str(error), 2)
    except RunNotFoundError as error:
        _fail(str(error), 2)
    except RunNotRunningError as error:
        _fail(str(error), 1)
    except TriggerFailedError as error:
        _fail(str(error), 2)
    except ClientError as error:
        _fail(f"{target.describe()} refused: {error}", 2)
    except BotoCoreError as error:
        _fail(f"cannot reach the {target.describe()}: {error}", 2)


def _runs(target: StackTarget) -> Runs:
    return Runs(
        sfn=target.client("stepfunctions"),
        s3=target.client("s3"),
        bucket=target.output("DataBucketName"),
        state_machine_arn=target.output("RetrainStateMachineArn"),
    )


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{rest:02d}s"


@app.command(name="list")
def list_runs(
    stack: StackOption = None,
    region: RegionOption = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="How many runs, newest first.")] = 20,
    as_json: JsonOption = False,
) -> None:
    """The newest runs: dataset version, status, duration, mIoU and its change, the gate's verdict."""
    target = targets.connect(stack, region, errors)
    with _talking_to(target):
        rows = _runs(target).rows(limit)
    if as_json:
        typer.echo(json.dumps([row.model_dump(mode="json") for row in rows], indent=2))
        return
    if not rows:
        console.print("No runs yet: a run starts when enough curated data has arrived (or `retrain runs rerun`).")
        return
    table = Table(title=f"Runs of {target.name}, newest first")
    for column in ("run", "dataset version", "status", "started (UTC)", "duration", "mIoU", "change", "gate"):
        table.add_column(column, overflow="fold")
    for row in rows:
        status = row.outcome or row.status.lower()
        table.add_row(
            row.run,
            row.dataset_version or "",
            status,
            f"{row.started_at.astimezone(UTC):%Y-%m-%d %H:%M}",
            _duration(row.duration_seconds),
            f"{row.miou:.3f}" if row.miou is not None else "",
            f"{row.miou_change:+.3f}" if row.miou_change is not None else "",
            row.gate or "",
        )
    console.print(table)


@app.command()
def show(run: RunArgument, stack: StackOption = None, region: RegionOption = None, as_json: JsonOption = False) -> None:
    """One run: its summary (as the team's message says it), rule verdicts and links."""
    target = targets.connect(stack, region, errors)
    with _talking_to(target):
        runs = _runs(target)
        details = runs.details(run)
    if as_json:
        typer.echo(details.model_dump_json(indent=2))
        return
    console.print(f"[bold]{run}[/bold]: execution {details.status.lower()}", soft_wrap=True)
    console.print(f"dataset version  {details.dataset_version or 'unknown'}")
    console.print(f"started          {details.started_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC")
    if details.current_state:
        console.print(f"now in           {details.current_state}")
    if details.job_name:
        console.print(f"training job     {details.job_name}")
    summary = details.summary
    if summary is None:
        console.print(
            "No summary yet: an evaluated run writes reports/runs/<run>/summary.json, "
            "one that ends before its evaluation reports/failures/<run>/summary.json."
        )
        return
    report_key = prefixes.split_s3_uri(summary.artifacts.report)[1] if summary.artifacts.report else None
    links = run_links(
        region=target.region,
        bucket=runs.bucket,
        folder=prefixes.split_s3_uri(summary.artifacts.folder)[1],
        job_name=summary.job.name if summary.job else None,
        execution_arn=summary.execution_arn,
        report_key=report_key,
        batches=summary.new_batches,
    )
    console.print()
    console.print(render.render(summary, links).text, soft_wrap=True, markup=False, highlight=False)
    console.print()
    console.print(f"Run folder: {summary.artifacts.folder}", soft_wrap=True)
    if summary.artifacts.report:
        console.print(f"A link that opens without AWS credentials: retrain link {run}", soft_wrap=True)


@app.command()
def start(stack: StackOption = None, region: RegionOption = None, as_json: JsonOption = False) -> None:
    """Start a run now on the curated pairs no run has seen, however few and however recent (the
    stack's trigger otherwise waits for MinNewPairs or MaxDelaySeconds). Every other rule holds:
    one run at a time (the lock), batches settled, held pairs left out, both splits present."""
    target = targets.connect(stack, region, errors)
    with _talking_to(target):
        function = target.output("TriggerFunctionName")
        outcome = start_now(target.client("lambda"), function, _who(target))
    _say_started(outcome, "no run started", as_json)


@app.command()
def rerun(
    run: RunArgument, stack: StackOption = None, region: RegionOption = None, *, as_json: JsonOption = False
) -> None:
    """Start a new run on RUN's dataset version, under the same lock as every run."""
    target = targets.connect(stack, region, errors)
    with _talking_to(target):
        runs = _runs(target)
        trigger = Trigger(
            ledger=Ledger(target.client("dynamodb"), target.output("LedgerTableName")),
            bucket=DataBucket(runs.s3, runs.bucket),
            sfn=runs.sfn,
            state_machine_arn=runs.state_machine_arn,
            taxonomy=DEFAULT_TAXONOMY,  # a rerun freezes nothing: the taxonomy is not used
            policy=TriggerPolicy(),
            clock=lambda: datetime.now(UTC),
        )
        outcome = runs.rerun(run, trigger)
    _say_started(outcome, "no rerun started", as_json)


def _say_started(outcome: TriggerOutcome, refused: str, as_json: bool) -> None:
    """The run started, or why none was (exit 1); under --json, `{"started", "reason"}` either way."""
    if as_json:
        typer.echo(outcome.model_dump_json(indent=2, exclude={"released"}))
    if outcome.started is None:
        _fail(f"{refused}: {outcome.reason}", 1)
    if not as_json:
        console.print(f"Started run [bold]{outcome.started}[/bold] ({outcome.reason}).", soft_wrap=True)
        console.print(f"Follow it with: retrain runs show {outcome.started}", soft_wrap=True)


@app.command()
def cancel(
    run: RunArgument,
    *,
    stack: StackOption = None,
    region: RegionOption = None,
    notify: Annotated[
        bool, typer.Option(help="If RunEndedFunction does not clean up, tell the team from here (SNS and Slack).")
    ] = True,
    job_timeout: Annotated[
        float,
        typer.Option(
            min=0, callback=finite, help="Seconds to wait for RunEndedFunction to stop the job and free the lock."
        ),
    ] = 120.0,
    as_json: JsonOption = False,
) -> None:
    """Stop RUN's execution; its job is stopped, the team told and the lock freed as for any end."""
    progress = errors if as_json else console  # stdout carries the JSON alone
    target = targets.connect(stack, region, errors)
    with _talking_to(target):
        runs = _runs(target)
        notifier = _notifier(target, runs) if notify else None
        who = _who(target)
        outcome = runs.cancel(
            run,
            sagemaker=target.client("sagemaker"),
            ledger=Ledger(target.client("dynamodb"), target.output("LedgerTableName")),
            notifier=notifier,
            who=who,
            release=release_through(target.client("lambda"), target.output("ReleaseFunctionName"), who),
            job_timeout=job_timeout,
            progress=lambda line: progress.print(f"  {line}", soft_wrap=True),
        )
    if as_json:
        typer.echo(outcome.model_dump_json(indent=2))
    else:
        console.print(f"Run [bold]{run}[/bold] cancelled (cleaned up by {outcome.cleaned_up_by}).", soft_wrap=True)
    if outcome.job_status in {"InProgress", "Stopping"}:
        _fail(f"training job {outcome.job_name} is still {outcome.job_status} after {job_timeout:.0f} s", 1)


def _notifier(target: StackTarget, runs: Runs) -> Notifier:
    secrets = SecretsProvider(boto3_client=target.client("secretsmanager"))
    return Notifier(
        s3=runs.s3,
        sns=target.client("sns"),
        sts=target.client("sts"),
        bucket=runs.bucket,
        topic_arn=target.output("NotificationTopicArn"),
        region=target.region,
        report_reader_role_arn="",  # a stopped run has no report to link to
        webhook=SlackWebhookSecret(secrets, target.outputs.get("SlackWebhookSecretArn", "")),
    )


def _who(target: StackTarget) -> str:
    """Who cancels, as the message will say: the caller's AWS identity, or the local user."""
    if target.kind == "aws":
        try:
            return str(target.client("sts").get_caller_identity()["Arn"])
        except (ClientError, BotoCoreError):
            pass
    return getpass.getuser()
