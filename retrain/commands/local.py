"""`retrain local up` and `retrain local demo`: the whole system on this machine, no AWS account."""

from __future__ import annotations

import json
import logging
import os
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
from retrain.local import discovery
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


def _print_slack(message: dict[str, Any]) -> None:
    console.print(
        f"[bold]Slack[/bold] ({len(message.get('blocks', []))} blocks): {message.get('text', '')}", soft_wrap=True
    )


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
        f"Slack webhook    {'a loopback receiver (its URL is in the stack secret)' if stack.slack else 'off'}",
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
    stack = _start(StackOptions(mode="server", port=port, tick_seconds=tick_seconds, parameters=_parse_params(param)))
    stopping = threading.Event()

    def request_stop(signum: int, frame: Any) -> None:
        stopping.set()

    previous = signal.signal(signal.SIGTERM, request_stop)
    try:
        # Where it is, for `retrain runs`, `retrain data` and `retrain link` in other terminals.
        record = discovery.publish(
            discovery.LocalStackRecord(
                stack_name=stack.options.stack_name,
                region=stack.options.region,
                endpoint_url=stack.endpoint_url or "",
                outputs=dict(stack.created.outputs),
                pid=os.getpid(),
            )
        )
        console.print(describe(stack), soft_wrap=True)
        console.print(
            f"Other terminals find this stack without flags (`retrain runs list`); it is recorded in {record}.",
            soft_wrap=True,
        )
        inbox = stack.topic_inbox()
        if stack.slack is not None:
            stack.slack.on_message = _print_slack
        console.print("Up. Every message sent to the team is printed here. Press Ctrl-C to stop.")
        while not stopping.wait(0.5):
            for message in inbox.receive():
                console.print(
                    f"[bold]SNS e-mail[/bold]: {message.get('Subject', '')}\n{message['Message']}", soft_wrap=True
                )
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        discovery.withdraw()
        console.print("Stopping: executions, poller, ticker, server ...")
        stack.stop()
        console.print("Stopped.")


# The demo's drop is small: start a run for any closed batch at once (production: 500 pairs or
# 6 hours, and a minute for a batch's last events to settle).
# A run that trains for real in about a minute here: one emulated CPU host, a narrow model.
DEMO_PARAMETERS = {
    "MinNewPairs": "1",
    "SettleSeconds": "0",
    "PollSeconds": "1",
    "PollMaxSeconds": "2",
    "TrainingInstanceType": "ml.m5.xlarge",
    "TrainingInstanceCount": "1",
    "TrainingEpochs": "4",
    "TrainingWidth": "0.25",
    "TrainingBatchSize": "4",
    "TrainingCrop": "128x64",
    "TrainingExtraHyperparameters": '{"workers": 0}',
}
FINAL = {"curated", "quarantined", "duplicate", "superseded", "marker"}


@app.command()
def demo(
    count: Annotated[int, typer.Option(min=1, max=500, help="Scenes in the demo batch.")] = 24,
    size: Annotated[str, typer.Option(help="Scene size as WIDTHxHEIGHT.")] = "256x128",
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the flow.")] = 300.0,
) -> None:
    """Start the stack, drop a synthetic batch (with two broken files), show what the flow did."""
    from retrain.commands.synth import parse_size  # noqa: PLC0415 (keeps `local up` light)
    from retrain.synth import write_scenes  # noqa: PLC0415

    width, height = parse_size(size)
    # Functions log JSON at INFO on AWS; here the summary below says what happened.
    quiet = {"POWERTOOLS_LOG_LEVEL": "WARNING", "POWERTOOLS_METRICS_DISABLED": "true"}
    logging.getLogger("moto").setLevel(logging.CRITICAL)
    stack = _start(StackOptions(mode="server", parameters=DEMO_PARAMETERS, function_environment=quiet))
    try:
        console.print(describe(stack), soft_wrap=True)
        inbox = _subscribe(stack)
        bucket = stack.created.outputs["DataBucketName"]
        batch = time.strftime("demo-%Y%m%d-%H%M%S")
        with tempfile.TemporaryDirectory() as folder:
            pairs = write_scenes(Path(folder), count=count, size=(width, height), seed=0)
            keys = _upload(stack, bucket, batch, pairs)
        console.print(f"Uploaded {len(keys)} objects to s3://{bucket}/incoming/{batch}/", soft_wrap=True)
        fates = _wait_for_fates(stack, batch, keys, timeout)
        console.print(_fates_table(keys, fates))
        run = _wait_for_run(stack, timeout)
        _show_run(stack, bucket, batch, run, inbox)
        if len(fates) < len(keys) or run is None or run["status"] != "SUCCEEDED":
            console.print("[red]the flow did not finish as expected[/red]")
            raise typer.Exit(1)
    finally:
        stack.stop()
    console.print("Offline stack stopped; nothing left running.")


def _upload(stack: OfflineStack, bucket: str, batch: str, pairs: list[tuple[Path, Path]]) -> list[str]:
    """The scenes, one of them with a mask of unknown classes, a stray file, then the marker."""
    s3 = stack.aws.s3
    files: list[tuple[str, bytes]] = []
    for image, label in pairs:
        files.append((f"images/{image.name}", image.read_bytes()))
        files.append((f"labels/{label.name}", label.read_bytes()))
    broken = files[-1][0]
    files[-1] = (broken, _mask_with_unknown_classes(pairs[-1][1]))
    files.append(("images/notes.txt", b"annotator's notes, uploaded by mistake"))
    files.append(("_COMPLETE", b""))
    keys = []
    for relative, body in files:
        key = f"{prefixes.INCOMING}{batch}/{relative}"
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        keys.append(key)
    return keys


def _mask_with_unknown_classes(label: Path) -> bytes:
    import io  # noqa: PLC0415

    from PIL import Image  # noqa: PLC0415

    with Image.open(label) as mask:
        broken = mask.point(lambda value: 77 if value == 0 else value)  # road painted as id 77
        buffer = io.BytesIO()
        broken.save(buffer, format="PNG")
    return buffer.getvalue()


def _fates(stack: OfflineStack, batch: str) -> dict[str, dict[str, Any]]:
    """The current fate of each landing key of the batch, from the ledger."""
    dynamodb = stack.aws.dynamodb
    pages = dynamodb.get_paginator("query").paginate(
        TableName=stack.ref("LedgerTable"),
        KeyConditionExpression="pk = :pk AND begins_with(sk, :files)",
        ExpressionAttributeValues={":pk": {"S": f"batch#{batch}"}, ":files": {"S": "file#"}},
    )
    fates: dict[str, dict[str, Any]] = {}
    for page in pages:
        for item in page["Items"]:
            record = json.loads(item["record"]["S"])
            if record["status"] != "superseded":
                fates[record["key"]] = record
    return fates


def _wait_for_fates(stack: OfflineStack, batch: str, keys: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    fates: dict[str, dict[str, Any]] = {}
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("S3 -> SQS -> intake -> ledger", total=len(keys))
        while time.monotonic() < deadline:
            fates = {k: f for k, f in _fates(stack, batch).items() if f["status"] in FINAL}
            progress.update(task, completed=len(fates))
            if len(fates) >= len(keys):
                break
            time.sleep(0.2)
    return fates


def _fates_table(keys: list[str], fates: dict[str, dict[str, Any]]) -> Table:
    table = Table(title="What the flow did with each object")
    for column in ("object", "status", "where / why"):
        table.add_column(column)
    for key in keys:
        name = key.removeprefix(f"{prefixes.INCOMING}{prefixes.batch_of(key)}/")
        fate = fates.get(key)
        if fate is None:
            table.add_row(name, "[red]not accounted for[/red]", "")
            continue
        why = "; ".join(r["code"] for r in fate.get("reasons", [])) or fate.get("destination") or ""
        table.add_row(name, fate["status"], why)
    return table


def _subscribe(stack: OfflineStack) -> str:
    """An SQS queue on the topic: the notifications the team would get by e-mail."""
    sqs = stack.aws.sqs
    url = sqs.create_queue(QueueName="demo-notifications")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    stack.aws.sns.subscribe(TopicArn=stack.ref("NotificationTopic"), Protocol="sqs", Endpoint=arn)
    return url


def _wait_for_run(stack: OfflineStack, timeout: float) -> dict[str, Any] | None:
    sfn = stack.aws.stepfunctions
    machine = stack.ref("RetrainStateMachine")
    deadline = time.monotonic() + timeout
    with console.status("waiting for the trigger and the retraining run"):
        while time.monotonic() < deadline:
            runs = sfn.list_executions(stateMachineArn=machine)["executions"]
            done = [dict(r) for r in runs if r["status"] != "RUNNING"]
            if done:
                return done[0]
            if not runs and _trigger_declined(stack) is not None:
                return None  # the trigger looked and decided to wait: nothing will start
            time.sleep(0.2)
    return None


def _trigger_declined(stack: OfflineStack) -> str | None:
    """The reason the trigger last gave for not starting a run, if it did not start one."""
    looks = [i for i in stack.runtime.invocations if i.function.endswith("TriggerFunction") and not i.failed]
    if not looks or looks[-1].payload.get("started"):
        return None
    return str(looks[-1].payload.get("reason"))


def _show_run(stack: OfflineStack, bucket: str, batch: str, run: dict[str, Any] | None, inbox: str) -> None:
    console.print(f"Batch report: s3://{bucket}/{prefixes.report_key(batch, 'report.md')}", soft_wrap=True)
    if run is None:
        console.print(f"No retraining run started: {_trigger_declined(stack) or 'the trigger did not run'}.")
        return
    version = run["name"]
    manifest = stack.aws.s3.get_object(Bucket=bucket, Key=prefixes.manifest_key(version))
    pairs = sum(1 for line in manifest["Body"].iter_lines() if line.strip())
    console.print(
        f"Dataset version {version}: {pairs} pairs, s3://{bucket}/{prefixes.manifest_key(version)}",
        soft_wrap=True,
    )
    console.print(f"Retraining run {version}: {run['status']}")
    summary_key = prefixes.run_report_key(version, "summary.json")
    try:
        summary = json.loads(stack.aws.s3.get_object(Bucket=bucket, Key=summary_key)["Body"].read())
    except stack.aws.s3.exceptions.NoSuchKey:
        summary = None
    if summary is not None:
        miou = summary.get("miou")
        shown = f", mIoU {miou:.3f}" if miou is not None else ""
        console.print(f"Outcome: [bold]{summary['outcome']}[/bold]{shown}")
        console.print(f"Run summary and reports: s3://{bucket}/{prefixes.run_report_key(version, '')}", soft_wrap=True)
    messages = stack.aws.sqs.receive_message(QueueUrl=inbox, MaxNumberOfMessages=10, WaitTimeSeconds=1)
    for message in messages.get("Messages", []):
        body = json.loads(message["Body"])
        subject, text = body.get("Subject", ""), body["Message"]
        console.print(f"Notification (SNS e-mail): [bold]{subject}[/bold]\n{text}", soft_wrap=True)
    for posted in stack.slack.messages if stack.slack else []:
        console.print(f"Notification (Slack, {len(posted['blocks'])} blocks):", soft_wrap=True)
        console.print_json(json.dumps(posted))
