"""`retrain local up` and `retrain local demo`: the whole system on this machine, no AWS account."""

from __future__ import annotations

import logging
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from functions.common import prefixes
from retrain.local.stack import OfflineStack, StackOptions
from retrain.local.template import TemplateError

app = typer.Typer(help="Run the system offline: moto, the real functions and state machine.")
console = Console()

PortOption = Annotated[int, typer.Option(help="Loopback port for the AWS endpoint (0: any free).")]
TickOption = Annotated[
    float | None,
    typer.Option(help="Run every schedule at this interval in seconds instead of its own rate."),
]
ParamOption = Annotated[
    list[str] | None,
    typer.Option("--param", help="Template parameter override, NAME=VALUE (repeatable)."),
]


def _parse_params(values: list[str] | None) -> dict[str, str]:
    params: dict[str, str] = {}
    for value in values or []:
        name, sep, setting = value.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"expected NAME=VALUE, got {value!r}", param_hint="--param")
        params[name] = setting
    return params


def _start(options: StackOptions) -> OfflineStack:
    try:
        return OfflineStack(options).start()
    except TemplateError as exc:
        console.print(f"[red]cannot start the offline stack:[/red] {exc}")
        raise typer.Exit(2) from exc


def describe(stack: OfflineStack) -> str:
    """What a user needs to talk to the stack from another terminal (unwrapped, to copy)."""
    outputs = stack.created.outputs
    bucket = outputs["DataBucketName"]
    endpoint = stack.endpoint_url or "(in-process)"
    lines = [
        f"AWS endpoint     {endpoint}",
        f"data bucket      s3://{bucket}",
        f"state machine    {outputs['RetrainStateMachineArn']}",
        f"topic            {outputs['NotificationTopicArn']}",
        f"functions        {', '.join(sorted(stack.runtime.functions))}",
        "",
        "Drop a labeled batch in (any credentials work offline):",
        f"  AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing aws --endpoint-url {endpoint} "
        f"s3 cp --recursive ./my-batch s3://{bucket}/incoming/my-batch/",
    ]
    return "\n".join(["[bold]Offline stack is up[/bold]", *lines])


@app.command()
def up(
    port: PortOption = 0,
    tick_seconds: TickOption = None,
    param: ParamOption = None,
) -> None:
    """Start the offline stack on loopback and keep it up until Ctrl-C."""
    stack = _start(
        StackOptions(
            mode="server", port=port, tick_seconds=tick_seconds, parameters=_parse_params(param)
        )
    )
    stopping = threading.Event()

    def request_stop(signum: int, frame: Any) -> None:
        stopping.set()

    previous = signal.signal(signal.SIGTERM, request_stop)
    try:
        console.print(describe(stack), soft_wrap=True)
        console.print("Up. Press Ctrl-C to stop.")
        while not stopping.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        console.print("Stopping: executions, poller, ticker, server ...")
        stack.stop()
        console.print("Stopped.")


@app.command()
def demo(
    count: Annotated[int, typer.Option(min=1, max=500, help="Scenes in the demo batch.")] = 8,
    size: Annotated[str, typer.Option(help="Scene size as WIDTHxHEIGHT.")] = "256x128",
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the flow.")] = 120.0,
) -> None:
    """Start the stack, drop a synthetic batch into the bucket, show what the flow did, stop."""
    from retrain.commands.synth import parse_size  # noqa: PLC0415 (keeps `local up` light)
    from retrain.synth import write_scenes  # noqa: PLC0415

    width, height = parse_size(size)
    # Functions log JSON at INFO on AWS; here the summary below says what happened.
    quiet = {"POWERTOOLS_LOG_LEVEL": "WARNING", "POWERTOOLS_METRICS_DISABLED": "true"}
    logging.getLogger("moto").setLevel(logging.CRITICAL)
    stack = _start(StackOptions(mode="server", function_environment=quiet))
    try:
        console.print(describe(stack), soft_wrap=True)
        bucket = stack.created.outputs["DataBucketName"]
        batch = time.strftime("demo-%Y%m%d-%H%M%S")
        with tempfile.TemporaryDirectory() as folder:
            pairs = write_scenes(Path(folder), count=count, size=(width, height), seed=0)
            keys = _upload(stack, bucket, batch, pairs)
        console.print(f"Uploaded {len(keys)} objects to s3://{bucket}/incoming/{batch}/")
        accounted = _wait_for_ledger(stack, keys, timeout)
        console.print(_ledger_table(stack, keys))
        queues = _queue_depths(stack)
        console.print(
            f"ledger: {len(accounted)}/{len(keys)} objects accounted for; "
            + ", ".join(f"{name}: {depth} waiting" for name, depth in queues.items())
        )
        console.print(
            "Next in the flow (not built yet): validation and curation into dataset/, "
            "then a retraining run of the state machine."
        )
        if len(accounted) < len(keys):
            console.print(f"[red]{len(keys) - len(accounted)} objects not accounted for[/red]")
            raise typer.Exit(1)
    finally:
        stack.stop()
    console.print("Offline stack stopped; nothing left running.")


def _upload(
    stack: OfflineStack, bucket: str, batch: str, pairs: list[tuple[Path, Path]]
) -> list[str]:
    s3 = stack.aws.s3
    keys: list[str] = []
    for image, label in pairs:
        for path, folder in ((image, "images"), (label, "labels")):
            key = f"{prefixes.INCOMING}{batch}/{folder}/{path.name}"
            s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
            keys.append(key)
    marker = f"{prefixes.INCOMING}{batch}/_COMPLETE"
    s3.put_object(Bucket=bucket, Key=marker, Body=b"")
    keys.append(marker)
    return keys


def _ledger_items(stack: OfflineStack) -> dict[str, dict[str, Any]]:
    dynamodb = stack.aws.dynamodb
    items: dict[str, dict[str, Any]] = {}
    for page in dynamodb.get_paginator("scan").paginate(TableName=stack.ref("LedgerTable")):
        for item in page["Items"]:
            items[item["key"]["S"]] = {
                name: next(iter(value.values())) for name, value in item.items()
            }
    return items


def _wait_for_ledger(stack: OfflineStack, keys: list[str], timeout: float) -> set[str]:
    wanted = set(keys)
    accounted: set[str] = set()
    deadline = time.monotonic() + timeout
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("S3 -> SQS -> intake -> ledger", total=len(wanted))
        while accounted != wanted and time.monotonic() < deadline:
            accounted = wanted & set(_ledger_items(stack))
            progress.update(task, completed=len(accounted))
            time.sleep(0.2)
    return accounted


def _ledger_table(stack: OfflineStack, keys: list[str]) -> Table:
    items = _ledger_items(stack)
    table = Table(title="What the flow did with each object")
    for column in ("batch", "object", "bytes", "status"):
        table.add_column(column)
    for key in keys:
        batch = prefixes.batch_of(key) or ""
        name = key.removeprefix(f"{prefixes.INCOMING}{batch}/")
        item = items.get(key)
        if item is None:
            table.add_row(batch, name, "", "[red]not accounted for[/red]")
        else:
            table.add_row(batch, name, item.get("size", ""), item["status"])
    return table


def _queue_depths(stack: OfflineStack) -> dict[str, int]:
    depths: dict[str, int] = {}
    for logical_id in ("IntakeQueue", "IntakeDeadLetterQueue"):
        attributes = stack.aws.sqs.get_queue_attributes(
            QueueUrl=stack.ref(logical_id), AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        depths[logical_id] = int(attributes["ApproximateNumberOfMessages"])
    return depths
