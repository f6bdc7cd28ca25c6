"""`retrain local up` and `retrain local demo`: the whole system on this machine, no AWS account.

`retrain local demo --json` tells its story on stderr and prints how it ended as one document on
stdout (`DemoResult`: the runs, the batches, the second run's summary, the files to look at).
`retrain local up` takes no --json: it runs until stopped, and where it is, as JSON, is the
record it writes for other terminals (`LocalStackRecord`, the path it prints).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from retrain.commands.checks import finite, folder_to_write
from retrain.commands.extras import require
from retrain.commands.options import JsonOption, print_json

if TYPE_CHECKING:
    # The offline stack (moto, cheroot, ...) is imported by the commands that run it, after
    # `require` says which extra is missing: `retrain --help` and `retrain[cli]` never load it.
    from retrain.local.cloudformation.stack import OfflineStack, StackOptions
    from retrain.local.lambda_runtime.poller import Delivery

app = typer.Typer(help="Run the system offline: moto, the real functions and state machine.")
console = Console()
errors = Console(stderr=True)

PortOption = Annotated[int, typer.Option(min=0, max=65535, help="Loopback port for the AWS endpoint (0: any free).")]
TickOption = Annotated[
    float | None,
    typer.Option(
        min=0.1, callback=finite, help="Run every schedule at this interval in seconds instead of its own rate."
    ),
]
ConcurrencyOption = Annotated[
    int,
    typer.Option(
        min=1,
        help="Invocations each function may run at once, each in its own worker process "
        "(1: all in this process, one at a time).",
    ),
]
DeliveryOption = Annotated[
    str,
    typer.Option(
        help="How SQS messages reach the functions: ordered, shuffled (out of order, across batches "
        "too) or duplicated (shuffled, and some twice, as S3 notifies at least once).",
    ),
]
SeedOption = Annotated[int | None, typer.Option(help="Seed of the shuffled or duplicated delivery (replays it).")]
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


def _delivery(value: str) -> Delivery:
    from retrain.local.lambda_runtime.poller import DELIVERIES  # noqa: PLC0415

    for delivery in DELIVERIES:
        if value == delivery:
            return delivery
    raise typer.BadParameter(f"one of {', '.join(DELIVERIES)}, not {value!r}", param_hint="--delivery")


def _start(options: StackOptions) -> OfflineStack:
    from retrain.local.cloudformation.stack import OfflineStack  # noqa: PLC0415
    from retrain.local.cloudformation.template import TemplateError  # noqa: PLC0415

    try:
        return OfflineStack(options).start()
    except TemplateError as exc:
        console.print(f"[red]cannot start the offline stack:[/red] {exc}")
        raise typer.Exit(2) from exc


def _print_slack(message: dict[str, Any]) -> None:
    console.print(
        f"[bold]Slack[/bold] ({len(message.get('blocks', []))} blocks): {message.get('text', '')}", soft_wrap=True
    )


def training_settings(options: StackOptions) -> list[str]:
    """What the stack's training jobs run with, and why not with a deployed stack's defaults."""
    from retrain.local.cloudformation.stack import OFFLINE_TRAINING  # noqa: PLC0415
    from retrain.local.cloudformation.template import load_template  # noqa: PLC0415

    declared = load_template(options.template).parameters
    deployed = {name: str(declared[name].get("Default", "")) for name in OFFLINE_TRAINING}
    used = {name: options.parameters.get(name, default) for name, default in deployed.items()}

    def settings(values: dict[str, str]) -> str:
        flags = values["TrainingExtraHyperparameters"]
        return (
            f"{values['TrainingInstanceCount']} x {values['TrainingInstanceType']}, {values['TrainingEpochs']} "
            f"epochs, crop {values['TrainingCrop']}, width {values['TrainingWidth']}, batch "
            f"{values['TrainingBatchSize']}" + ("" if flags == "{}" else f", trainer flags {flags}")
        )

    if used == deployed:
        return [f"training jobs    {settings(used)} (a deployed stack's defaults)"]
    return [
        f"training jobs    {settings(used)}",
        f"                 instead of a deployed stack's {settings(deployed)}: a job here is torchrun on this "
        "machine's CPU, on small images, and should end in minutes (change with --param, e.g. TrainingEpochs=10)",
    ]


def describe(stack: OfflineStack) -> str:
    """What a user needs to talk to the stack from another terminal (unwrapped, to copy)."""
    outputs = stack.created.outputs
    bucket = outputs["DataBucketName"]
    endpoint = stack.endpoint_url or "(in-process)"
    options = stack.options
    if options.lambda_concurrency > 1:
        lambdas = f"up to {options.lambda_concurrency} invocations per function at once, each in a worker process"
    else:
        lambdas = "in this process, one invocation at a time"
    delivery = f"{options.delivery}, {stack.poller.pollers} poller(s) per queue"
    if options.delivery != "ordered":
        delivery += f", seed {stack.poller.seed}"
    if options.delivery == "duplicated":
        delivery += f", {options.duplicate_fraction:.0%} of messages twice"
    lines = [
        f"AWS endpoint     {endpoint}",
        f"data bucket      s3://{bucket}",
        f"state machine    {outputs['RetrainStateMachineArn']}",
        f"topic            {outputs['NotificationTopicArn']}",
        f"functions        {', '.join(sorted(stack.runtime.functions))}",
        f"Lambda           {lambdas}",
        f"SQS delivery     {delivery}",
        *training_settings(options),
        f"Slack webhook    {'a loopback receiver (its URL is in the stack secret)' if stack.slack else 'off'}",
        "",
        "Drop a labeled batch in (any credentials work offline):",
        f"  AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing aws --endpoint-url {endpoint} "
        f"s3 cp --recursive ./my-batch s3://{bucket}/incoming/my-batch/",
    ]
    return "\n".join(["[bold]Offline stack is up[/bold]", *lines])


@app.command()
def up(  # noqa: PLR0917 (a command's options are its parameters)
    port: PortOption = 0,
    tick_seconds: TickOption = None,
    param: ParamOption = None,
    lambda_concurrency: ConcurrencyOption = 1,
    delivery: DeliveryOption = "ordered",
    delivery_seed: SeedOption = None,
) -> None:
    """Start the offline stack on loopback and keep it up until Ctrl-C."""
    require("local", "local up")
    from retrain.local.cloudformation.stack import (  # noqa: PLC0415
        OFFLINE_TRAINING,
        StackOptions,
        StackOptionsError,
        check_parameters,
    )
    from retrain.local.cloudformation.template import TemplateError  # noqa: PLC0415
    from retrain.local.endpoint import discovery  # noqa: PLC0415

    try:
        options = StackOptions(
            mode="server",
            port=port,
            tick_seconds=tick_seconds,
            parameters={**OFFLINE_TRAINING, **_parse_params(param)},
            lambda_concurrency=lambda_concurrency,
            delivery=_delivery(delivery),
            delivery_seed=delivery_seed,
        )
        # Before the stack starts: a --param the template refuses would stop it halfway.
        check_parameters(options)
    except StackOptionsError as exc:
        raise typer.BadParameter(str(exc)) from exc
    except TemplateError as exc:
        raise typer.BadParameter(str(exc), param_hint="--param") from exc
    stack = _start(options)
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


@app.command()
def demo(  # noqa: PLR0917 (a command's options are its parameters)
    count: Annotated[
        int, typer.Option(min=4, max=2000, help="Scenes of the first drop (the second drops a fifth as many).")
    ] = 200,
    size: Annotated[str, typer.Option(help="Scene size as WIDTHxHEIGHT.")] = "128x64",
    epochs: Annotated[int, typer.Option(min=1, max=100, help="Training epochs of the first run.")] = 8,
    processes: Annotated[
        int, typer.Option(min=1, max=8, help="Training hosts (emulated ml.m5.xlarge, one process each).")
    ] = 1,
    out: Annotated[Path, typer.Option(help="Where the run's report, summary and model are copied.")] = Path(
        "retrain-demo"
    ),
    timeout: Annotated[float, typer.Option(min=10, callback=finite, help="Seconds to wait for each stage.")] = 600.0,
    as_json: JsonOption = False,
) -> None:
    """The whole loop, twice: a first drop (a few files broken) trains the first model, which then
    screens a second team's drop whose part was exported with the wrong class map."""
    from functions.validation import DEFAULT_CONFIG  # noqa: PLC0415
    from retrain.commands.synth import MIN_SIZE, parse_size  # noqa: PLC0415

    # Arguments first: the stack takes seconds to start, and a wrong one would stop it halfway.
    # Scenes the intake accepts: at least what synth draws and what validation lets through.
    smallest = (max(MIN_SIZE[0], DEFAULT_CONFIG.min_width), max(MIN_SIZE[1], DEFAULT_CONFIG.min_height))
    scene_size = parse_size(size, smallest)
    folder_to_write(out, "--out")
    require("local", "local demo")
    require("trainer", "local demo")  # it draws scenes (numpy) and trains on them (torch)
    from retrain.local.cloudformation.template import TemplateError  # noqa: PLC0415
    from retrain.local.demo import Demo, DemoOptions  # noqa: PLC0415

    options = DemoOptions(count=count, size=scene_size, epochs=epochs, processes=processes, out=out, timeout=timeout)
    try:
        # A console of its own on this stdout (stderr under --json: stdout carries the document
        # alone), bound now: the functions' output goes elsewhere while they run.
        result = Demo(options, Console(file=sys.stderr if as_json else sys.stdout)).run()
    except TemplateError as exc:
        errors.print(f"[red]cannot start the offline stack:[/red] {exc}")
        raise typer.Exit(2) from exc
    if as_json:
        print_json(result)
    if not result.ok:
        errors.print(f"[red]the loop did not end as expected: {'; '.join(result.problems)}[/red]", soft_wrap=True)
        raise typer.Exit(1)
