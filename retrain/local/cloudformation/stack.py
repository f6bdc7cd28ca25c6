"""The offline stack: moto plus what moto cannot run, created from `template.yaml`.

`OfflineStack` starts moto (in-process `mock_aws` for tests, moto's app behind cheroot on loopback for
`retrain local up`) with its Step Functions engine on, creates the template's resources, hosts the
functions in-process (or, with `lambda_concurrency` above one, in worker processes that run
invocations at the same time), and plays the SQS event-source mappings, the schedules and
EventBridge's delivery of AWS services' events to the functions' rules (`stack.eventbridge`).
`stop()` leaves nothing running: executions are stopped and their threads joined, and the worker
processes ended, before moto goes away.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import urllib.request
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TextIO

from moto import mock_aws
from moto.stepfunctions.parser.utils import TMP_THREADS

from functions.common.errors import RetrainError
from retrain.local.cloudformation.resources import CreatedStack, ResourceBuilder
from retrain.local.cloudformation.template import Created, Resolver, TemplateError, load_template
from retrain.local.endpoint import moto_fixes
from retrain.local.endpoint.clients import StackClients
from retrain.local.endpoint.emulators import EmulatorRegistry
from retrain.local.endpoint.gateway import GatewayMotoServer
from retrain.local.events import s3_events
from retrain.local.events.eventbridge import Event, EventBus, ExecutionWatcher
from retrain.local.events.notifications import SlackReceiver, TopicInbox
from retrain.local.fsx.emulator import FsxEmulator
from retrain.local.lambda_runtime.lambdas import LambdaRuntime
from retrain.local.lambda_runtime.poller import DELIVERIES, Delivery, SqsPoller
from retrain.local.lambda_runtime.ticker import Ticker
from retrain.local.sagemaker.training import TrainingEmulator
from retrain.package import build_sourcedir, release_trainer

log = logging.getLogger(__name__)
moto_fixes.apply()

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_TEMPLATE = REPO_ROOT / "template.yaml"
ACCOUNT_ID = "123456789012"  # moto's default account
TERMINAL = {"SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"}
# Offline there are no credentials to protect; botocore still wants some to sign with.
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
# Template parameters that have no default because a deployment names an existing network: the
# offline stack makes one in moto (a VPC, two private subnets and their route table) and looks up
# the region's S3 prefix list there, so the template's security group and S3 endpoint are
# created against them as on AWS.
NETWORK_PARAMETERS = ("TrainingVpcId", "TrainingSubnetIds", "PrivateRouteTableIds", "S3PrefixListId")
LIST_TYPES = ("List<", "CommaDelimitedList")
# Who operates the stack (releases the trainer, erases data, administers the key): a deployment
# must name them (the template's OperatorsAreNamed rule). Offline, the one operator is whoever
# calls the emulator: the caller's own ARN, as a deployer would name their own role.
OPERATOR_PARAMETERS = ("TrainerReleasers", "ErasureOperatorArns", "KeyAdministratorArns")
# What `retrain local up` and the demo train with, over the template's defaults (a GPU instance,
# the full-width model, 1024x512 crops, 100 epochs): a job here is torchrun on this machine's
# CPU, on small images, so one emulated CPU host, a narrow model, small crops, a few epochs and
# no data-loading processes end a run in minutes. Tests name their own; `--param` overrides these.
OFFLINE_TRAINING = {
    "TrainingInstanceType": "ml.m5.xlarge",
    "TrainingInstanceCount": "1",
    "TrainingEpochs": "4",
    "TrainingWidth": "0.25",
    "TrainingBatchSize": "4",
    "TrainingCrop": "128x64",
    "TrainingExtraHyperparameters": '{"workers": 0}',
}


class StackOptionsError(RetrainError, ValueError):
    """Options the offline stack cannot honour together."""


@dataclass
class StackOptions:
    mode: Literal["mock", "server"] = "mock"
    template: Path = DEFAULT_TEMPLATE
    stack_name: str = "retrain-local"
    region: str = "us-east-1"
    parameters: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 0
    poll: bool = True
    tick: bool = True
    tick_seconds: float | None = None
    # Shorter SQS batching windows than the template's, for tests and demos.
    batching_window_seconds: float | None = None
    # Set for every function, over what the template gives it (a quieter log level, say).
    function_environment: dict[str, str] = field(default_factory=dict)
    # Where the functions' output goes (Powertools' JSON logs and EMF metrics: what CloudWatch
    # Logs receives on AWS), appended to; None: this process's stdout.
    function_log: Path | None = None
    # Where the emulated FSx mounts and training hosts live; None: a temporary folder, removed
    # when the stack stops.
    workdir: Path | None = None
    # Debugger's rule evaluations outlive the training job by this much (tests of the wait).
    rule_delay_seconds: float = 0.0
    # Release the trainer (sourcedir.tar.gz from trainer/) at start, as the deploy flow does.
    upload_trainer: bool = True
    # Start a loopback Slack webhook and store its URL in the stack's Slack secret.
    slack: bool = True
    # Execution environments per function. 1: every handler in this process, one invocation at a
    # time. Above 1 (server mode only): worker processes, that many per function at once.
    lambda_concurrency: int = 1
    # Pollers per SQS event-source mapping; None: one, or lambda_concurrency when above one.
    sqs_pollers: int | None = None
    # How the mappings deliver (see poller.py): in SQS's order, shuffled, or shuffled and some
    # messages twice (duplicate_fraction of them), with choices drawn from delivery_seed (None: a
    # random seed, logged).
    delivery: Delivery = "ordered"
    duplicate_fraction: float = 0.2
    delivery_seed: int | None = None
    # Look for executions whose status changed every `watch_seconds` in the background, for the
    # "Step Functions Execution Status Change" events; off: only `stack.eventbridge.sweep()` looks.
    # Independent of `poll` and `tick`: AWS sends these events whoever drives the functions.
    watch_executions: bool = True
    watch_seconds: float = 0.5

    def __post_init__(self) -> None:
        if self.lambda_concurrency < 1:
            raise StackOptionsError(f"lambda_concurrency is at least 1, not {self.lambda_concurrency}")
        if self.lambda_concurrency > 1 and self.mode != "server":
            raise StackOptionsError(
                f"lambda_concurrency={self.lambda_concurrency} needs mode='server': concurrent invocations run "
                "in worker processes, and other processes cannot reach moto running in-process (mode='mock', "
                "mock_aws); use mode='server' or lambda_concurrency=1"
            )
        if self.sqs_pollers is not None and self.sqs_pollers < 1:
            raise StackOptionsError(f"sqs_pollers is at least 1, not {self.sqs_pollers}")
        if self.delivery not in DELIVERIES:
            raise StackOptionsError(f"delivery is one of {', '.join(DELIVERIES)}, not {self.delivery!r}")
        if not 0.0 <= self.duplicate_fraction <= 1.0:
            raise StackOptionsError(f"duplicate_fraction is between 0 and 1, not {self.duplicate_fraction}")
        if self.watch_seconds <= 0:
            raise StackOptionsError(f"watch_seconds is above 0, not {self.watch_seconds}")

    @property
    def pollers(self) -> int:
        """Pollers per mapping: as many as a function may run invocations at once, unless told."""
        return self.sqs_pollers if self.sqs_pollers is not None else self.lambda_concurrency


class OfflineStack:
    def __init__(self, options: StackOptions | None = None) -> None:
        self.options = options or StackOptions()
        self.endpoint_url: str | None = None
        self.emulators = EmulatorRegistry()
        self._mock: Any = None
        self._server: GatewayMotoServer | None = None
        self._saved_environment: dict[str, str | None] = {}
        self._aws: StackClients | None = None
        self._created: CreatedStack | None = None
        self._runtime: LambdaRuntime | None = None
        self._poller: SqsPoller | None = None
        self._ticker: Ticker | None = None
        self._eventbridge: EventBus | None = None
        self._workdir: Path | None = None
        self._own_workdir = False
        self._function_log: TextIO | None = None
        self.fsx: FsxEmulator | None = None
        self.slack: SlackReceiver | None = None
        self.training: TrainingEmulator | None = None
        self._s3_events: AbstractContextManager[None] | None = None

    # ------------------------------------------------------------ life cycle --
    def start(self) -> OfflineStack:
        options = self.options
        template = load_template(options.template)
        lists = frozenset(
            name for name, spec in template.parameters.items() if str(spec.get("Type", "")).startswith(LIST_TYPES)
        )
        try:
            self._start_moto()
            # S3's notifications name the version they are about, as AWS's do.
            self._s3_events = s3_events.aws_shaped_events()
            self._s3_events.__enter__()
            # First: every client of boto3's default session made from now on reaches them.
            self.emulators.install()
            aws = StackClients.create(region=options.region, endpoint_url=self.endpoint_url)
            # Before the emulators that emit: its rules come with the functions, further down.
            eventbridge = self._make_eventbridge()
            offline = {
                **_offline_network(aws, template.parameters, options.parameters),
                **_offline_operators(aws, template.parameters, options.parameters),
            }
            parameters = _parameters(template.parameters, {**offline, **options.parameters})
            workdir = self._make_workdir()
            # Before the resources: the template's FSx file system is created by the emulator.
            self.fsx = FsxEmulator(s3=aws.s3, workdir=workdir / "fsx", region=options.region, account_id=ACCOUNT_ID)
            self.fsx.register(self.emulators)
            self.training = TrainingEmulator(
                s3=aws.s3,
                logs=aws.logs,
                workdir=workdir / "sagemaker",
                region=options.region,
                account_id=ACCOUNT_ID,
                resolve_file_system=self.fsx.mount_path,
                rule_delay_seconds=options.rule_delay_seconds,
                on_event=eventbridge.emit,
            )
            self.training.register(self.emulators)
            resolver = Resolver(
                options.stack_name,
                options.region,
                ACCOUNT_ID,
                parameters,
                list_parameters=lists,
                condition_definitions=template.conditions,
                mappings=template.mappings,
            )
            created = ResourceBuilder(template, resolver, aws).build()
            if options.upload_trainer:
                self._upload_trainer(aws, created.resources["DataBucket"].ref, workdir)
            if options.slack and "SlackWebhookSecret" in created.resources:
                self.slack = SlackReceiver().start()
                # As an operator does after deploying; they may store another URL later.
                aws.secretsmanager.put_secret_value(
                    SecretId=created.resources["SlackWebhookSecret"].ref,
                    SecretString=json.dumps({"webhook_url": self.slack.url}),
                )
            base_environment = dict(options.function_environment)
            if self.endpoint_url is not None:
                base_environment["AWS_ENDPOINT_URL"] = self.endpoint_url
            if options.lambda_concurrency > 1:
                # A worker signs its own requests to the server; offline, with the placeholders.
                base_environment.update(FAKE_CREDENTIALS)
            if options.function_log is not None:
                options.function_log.parent.mkdir(parents=True, exist_ok=True)
                self._function_log = options.function_log.open("a", encoding="utf-8", buffering=1)
            runtime = LambdaRuntime(
                region=options.region,
                account_id=ACCOUNT_ID,
                base_environment=base_environment,
                concurrency=options.lambda_concurrency,
                output=self._function_log,
            )
            for spec in created.functions:
                environment = {**spec.environment, **options.function_environment}
                runtime.add(replace(spec, environment=environment))
            runtime.cold_start_all()
            self.emulators.register("lambda", "Invoke", runtime.handle_invoke)
            self._aws, self._created, self._runtime = aws, created, runtime
            self._poller = SqsPoller(
                aws.sqs,
                runtime,
                options.region,
                window_override=options.batching_window_seconds,
                pollers=options.pollers,
                delivery=options.delivery,
                duplicate_fraction=options.duplicate_fraction,
                seed=options.delivery_seed,
            )
            for mapping in created.mappings:
                self._poller.add(mapping)
            self._ticker = Ticker(
                runtime,
                region=options.region,
                account_id=ACCOUNT_ID,
                interval_override=options.tick_seconds,
            )
            for schedule in created.schedules:
                self._ticker.add(schedule)
            self._start_eventbridge(aws, created)
            if options.poll:
                self._poller.start()
            if options.tick:
                self._ticker.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop everything this stack started, in the order that leaves nothing behind (and moto
        itself even when a step fails, so the next stack starts blank)."""
        try:
            if self._eventbridge is not None:
                # First: what stopping does (aborted executions, stopped jobs) invokes nothing.
                self._eventbridge.close()
            if self._ticker is not None:
                self._ticker.stop()
            if self._poller is not None:
                self._poller.stop()
            if self._aws is not None:
                self.stop_executions()
        finally:
            self._stop_emulators_and_moto()

    def _stop_emulators_and_moto(self) -> None:
        if self._runtime is not None:
            # After the poller, ticker and executions: nothing invokes any more.
            self._runtime.close()
        if self._function_log is not None:
            self._function_log.close()
            self._function_log = None
        if self.slack is not None:
            self.slack.stop()
            self.slack = None
        if self.training is not None:
            self.training.stop_all()
        if self.fsx is not None:
            self.fsx.stop_all()
        self.emulators.uninstall()
        if self._s3_events is not None:
            self._s3_events.__exit__(None, None, None)
            self._s3_events = None
        if self._mock is not None:
            self._mock.stop()
            self._mock = None
        if self._server is not None:
            # The server's backends are process-wide: empty them, so a later stack starts blank.
            self._moto_api("reset", {})
            self._server.stop()
            self._server = None
        for name, value in self._saved_environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_environment = {}
        self._aws = self._created = self._runtime = self._poller = self._ticker = self._eventbridge = None
        self.fsx = self.training = None
        if self._own_workdir and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        self._workdir = None

    def _make_eventbridge(self) -> EventBus:
        bus = EventBus(region=self.options.region, account_id=ACCOUNT_ID, invoke=self._invoke_async)
        # A function's (or a test's) PutEvents reaches the bus too; moto would call no Lambda.
        self.emulators.register("events", "PutEvents", bus.put_events)
        self._eventbridge = bus
        return bus

    def _start_eventbridge(self, aws: StackClients, created: CreatedStack) -> None:
        bus = self.eventbridge
        for rule in created.rules:
            bus.add(rule)
        bus.add_sweeper(ExecutionWatcher(aws.stepfunctions, bus).sweep)
        if self.options.watch_executions:
            bus.start(self.options.watch_seconds)

    def _make_workdir(self) -> Path:
        if self.options.workdir is not None:
            self._workdir = self.options.workdir
            self._workdir.mkdir(parents=True, exist_ok=True)
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix="retrain-local-"))
            self._own_workdir = True
        return self._workdir

    def _upload_trainer(self, aws: StackClients, bucket: str, workdir: Path) -> None:
        """What `make upload-trainer` does after a deploy: the release, under its sha256."""
        release_trainer(aws.s3, bucket, build_sourcedir(workdir / "code"))

    def __enter__(self) -> OfflineStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _set_environment(self, **variables: str) -> None:
        for name, value in variables.items():
            self._saved_environment.setdefault(name, os.environ.get(name))
            os.environ[name] = value

    def _start_moto(self) -> None:
        missing = {k: v for k, v in FAKE_CREDENTIALS.items() if not os.environ.get(k)}
        self._set_environment(AWS_DEFAULT_REGION=self.options.region, **missing)
        if self.options.mode == "mock":
            self._mock = mock_aws(config={"stepfunctions": {"execute_state_machine": True}})
            self._mock.start()
            return
        # With the emulators in front, so clients in other processes reach them too.
        server = GatewayMotoServer(
            self.emulators, region=self.options.region, ip_address=self.options.host, port=self.options.port
        )
        server.start()
        self._server = server
        host, port = server.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"
        # The Step Functions engine calls back into the server at localhost:$MOTO_PORT.
        self._set_environment(MOTO_PORT=str(port))
        self._moto_api("config", {"stepfunctions": {"execute_state_machine": True}})

    def _moto_api(self, action: str, body: dict[str, Any]) -> None:
        request = urllib.request.Request(  # noqa: S310 (our own loopback server)
            f"{self.endpoint_url}/moto-api/{action}", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=10):  # noqa: S310
            pass

    # -------------------------------------------------------------- access --
    @property
    def aws(self) -> StackClients:
        if self._aws is None:
            raise RuntimeError("the offline stack is not running")
        return self._aws

    @property
    def runtime(self) -> LambdaRuntime:
        if self._runtime is None:
            raise RuntimeError("the offline stack is not running")
        return self._runtime

    @property
    def poller(self) -> SqsPoller:
        if self._poller is None:
            raise RuntimeError("the offline stack is not running")
        return self._poller

    @property
    def ticker(self) -> Ticker:
        if self._ticker is None:
            raise RuntimeError("the offline stack is not running")
        return self._ticker

    @property
    def eventbridge(self) -> EventBus:
        """The default event bus: what was emitted and delivered, `sweep()`, `lose(...)`."""
        if self._eventbridge is None:
            raise RuntimeError("the offline stack is not running")
        return self._eventbridge

    @property
    def created(self) -> CreatedStack:
        if self._created is None:
            raise RuntimeError("the offline stack is not running")
        return self._created

    def resource(self, logical_id: str) -> Created:
        try:
            return self.created.resources[logical_id]
        except KeyError:
            raise KeyError(f"the template declares no {logical_id}") from None

    def ref(self, logical_id: str) -> str:
        return self.resource(logical_id).ref

    def topic_inbox(self, name: str = "operator-inbox") -> TopicInbox:
        """A queue subscribed to the notification topic: what an e-mail subscriber receives."""
        return TopicInbox(self.aws.sns, self.aws.sqs, self.ref("NotificationTopic"), name)

    def update_function_environment(self, logical_id: str, **variables: str) -> None:
        """Change a function's environment, as `aws lambda update-function-configuration` does:
        the next invocation is a cold start that sees the new variables."""
        spec = self.runtime.spec(self.ref(logical_id))
        self.runtime.add(replace(spec, environment={**spec.environment, **variables}))
        self.runtime.cold_start(spec.name)

    def _invoke_async(self, function: str, event: Event) -> None:
        """EventBridge's delivery to a Lambda target: an asynchronous Invoke (InvocationType
        Event), through the same path as any other client's."""
        self.runtime.handle_invoke(
            {"FunctionName": function, "InvocationType": "Event", "Payload": json.dumps(event).encode()}
        )

    # ------------------------------------------------------- executions --
    def wait_for_execution(self, execution_arn: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            description = self.aws.stepfunctions.describe_execution(executionArn=execution_arn)
            if description["status"] in TERMINAL:
                return dict(description)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{execution_arn} still {description['status']} after {timeout}s")
            time.sleep(0.1)

    def history(self, execution_arn: str) -> list[dict[str, Any]]:
        sfn = self.aws.stepfunctions
        events: list[dict[str, Any]] = []
        for page in sfn.get_paginator("get_execution_history").paginate(executionArn=execution_arn):
            events.extend(dict(event) for event in page["events"])
        return events

    def stop_executions(self, timeout: float = 30) -> None:
        """Stop every running execution and wait for the engine's threads to end."""
        sfn = self.aws.stepfunctions
        for machine in sfn.list_state_machines()["stateMachines"]:
            running = sfn.list_executions(stateMachineArn=machine["stateMachineArn"], statusFilter="RUNNING")[
                "executions"
            ]
            for execution in running:
                _stop_execution(sfn, execution["executionArn"])
        deadline = time.monotonic() + timeout
        for thread in list(TMP_THREADS):
            if thread is threading.current_thread():
                continue
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("a Step Functions engine thread is still running: %s", thread.name)
            # Waited for once: the engine's list is process-wide, and a thread that outlived its
            # stack must not hold every later stack's stop for the whole timeout again.
            TMP_THREADS.remove(thread)


def create_ledger_table(dynamodb: Any, name: str, template: Path = DEFAULT_TEMPLATE) -> None:
    """The ledger table alone, with the template's keys, indexes and billing: for the logic tests
    and benchmarks that need a real (emulated) ledger but no stack."""
    table = load_template(template).resources["LedgerTable"]["Properties"]
    dynamodb.create_table(
        TableName=name,
        AttributeDefinitions=table["AttributeDefinitions"],
        KeySchema=table["KeySchema"],
        GlobalSecondaryIndexes=table["GlobalSecondaryIndexes"],
        BillingMode=table["BillingMode"],
    )


def _stop_execution(sfn: Any, arn: str) -> None:
    """StopExecution, patient with moto's engine: an execution started a moment ago has no
    worker environment yet, and stopping it then raises inside moto (AttributeError)."""
    for _ in range(50):
        try:
            sfn.stop_execution(executionArn=arn, error="OfflineStackStopped", cause="the offline stack was stopped")
        except AttributeError:
            time.sleep(0.1)
        else:
            return
    log.warning("could not stop %s: moto's engine never got it going", arn)


def _offline_network(
    aws: StackClients, declared: dict[str, dict[str, Any]], overrides: dict[str, str]
) -> dict[str, str]:
    """A VPC with two private subnets and their route table, and S3's prefix list, for the network
    parameters not given."""
    wanted = [name for name in NETWORK_PARAMETERS if name in declared and name not in overrides]
    ec2 = aws.ec2
    network: dict[str, str] = {}
    if set(wanted) - {"S3PrefixListId"}:
        vpc_id = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
        subnets = [
            ec2.create_subnet(VpcId=vpc_id, CidrBlock=f"10.42.{index}.0/24")["Subnet"]["SubnetId"] for index in (1, 2)
        ]
        route_table = ec2.create_route_table(VpcId=vpc_id)["RouteTable"]["RouteTableId"]
        for subnet in subnets:
            ec2.associate_route_table(RouteTableId=route_table, SubnetId=subnet)
        network.update(
            {"TrainingVpcId": vpc_id, "TrainingSubnetIds": ",".join(subnets), "PrivateRouteTableIds": route_table}
        )
    if "S3PrefixListId" in wanted:
        # AWS manages one prefix list of S3's addresses per region; moto has it too.
        (s3_prefix_list,) = ec2.describe_managed_prefix_lists(
            Filters=[{"Name": "prefix-list-name", "Values": [f"com.amazonaws.{ec2.meta.region_name}.s3"]}]
        )["PrefixLists"]
        network["S3PrefixListId"] = s3_prefix_list["PrefixListId"]
    return {name: network[name] for name in wanted}


def _offline_operators(
    aws: StackClients, declared: dict[str, dict[str, Any]], overrides: dict[str, str]
) -> dict[str, str]:
    """The caller's ARN for each operator list not given (unless OpenOperatorAccess is asked for)."""
    wanted = [name for name in OPERATOR_PARAMETERS if name in declared and name not in overrides]
    if not wanted or overrides.get("OpenOperatorAccess") == "true":
        return {}
    caller = aws.sts.get_caller_identity()["Arn"]
    return dict.fromkeys(wanted, caller)


def check_parameters(options: StackOptions) -> None:
    """Refuse (TemplateError) the overrides `start` would refuse, before anything starts: names the
    template lacks, values CloudFormation would not take. The network's are filled in by `start`."""
    declared = load_template(options.template).parameters
    unknown = sorted(set(options.parameters) - set(declared))
    if unknown:
        raise TemplateError(f"the template has no parameter {', '.join(unknown)}")
    for name, value in options.parameters.items():
        _check_constraints(name, str(value), declared[name])


def _parameters(declared: dict[str, dict[str, Any]], overrides: dict[str, str]) -> dict[str, str]:
    unknown = sorted(set(overrides) - set(declared))
    if unknown:
        raise TemplateError(f"the template has no parameter {', '.join(unknown)}")
    values = {name: str(spec["Default"]) for name, spec in declared.items() if "Default" in spec}
    values.update({name: str(value) for name, value in overrides.items()})
    missing = sorted(set(declared) - set(values))
    if missing:
        raise TemplateError(f"parameters without a value: {', '.join(missing)}")
    for name, value in values.items():
        _check_constraints(name, value, declared[name])
    return values


def _check_constraints(name: str, value: str, spec: dict[str, Any]) -> None:
    """Refuse a value CloudFormation would refuse (AllowedValues, AllowedPattern, lengths, bounds)."""
    kind = str(spec.get("Type", "String"))
    # A list's constraints apply to each element, as CloudFormation checks them.
    items = value.split(",") if kind.startswith(LIST_TYPES) else [value]
    hint = f" ({spec['ConstraintDescription']})" if "ConstraintDescription" in spec else ""
    for item in items:
        if "AllowedValues" in spec and item not in [str(v) for v in spec["AllowedValues"]]:
            raise TemplateError(f"parameter {name}: {item!r} is not one of {spec['AllowedValues']}{hint}")
        if "AllowedPattern" in spec and re.fullmatch(str(spec["AllowedPattern"]), item) is None:
            raise TemplateError(f"parameter {name}: {item!r} does not match {spec['AllowedPattern']}{hint}")
        if "MinLength" in spec and len(item) < int(spec["MinLength"]):
            raise TemplateError(f"parameter {name}: {item!r} is shorter than {spec['MinLength']}{hint}")
        if "MaxLength" in spec and len(item) > int(spec["MaxLength"]):
            raise TemplateError(f"parameter {name}: {item!r} is longer than {spec['MaxLength']}{hint}")
        if kind == "Number":
            try:
                number = float(item)
            except ValueError:
                raise TemplateError(f"parameter {name}: {item!r} is not a number") from None
            if "MinValue" in spec and number < float(spec["MinValue"]):
                raise TemplateError(f"parameter {name}: {item} is below its MinValue {spec['MinValue']}{hint}")
            if "MaxValue" in spec and number > float(spec["MaxValue"]):
                raise TemplateError(f"parameter {name}: {item} is above its MaxValue {spec['MaxValue']}{hint}")
