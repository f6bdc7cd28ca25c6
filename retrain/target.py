"""Which stack a command talks to: a deployed one (`--stack NAME`) or the offline one.

Without `--stack`, commands use the offline stack that `retrain local up` runs in another
terminal (it records where it is: `retrain/local/endpoint/discovery.py`). With `--stack NAME`, the names
and ARNs come from that CloudFormation stack's outputs. Either way the command says which stack and
endpoint it used, and when none is reachable it says how to start one, without a traceback.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlparse

import boto3
import typer
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from rich.console import Console

from functions.common import clients
from functions.common.errors import RetrainError

if TYPE_CHECKING:
    from retrain.local.endpoint.discovery import LocalStackRecord

# Few retries: a person is waiting, and a wrong endpoint should say so within seconds.
CLI_CONFIG = Config(retries={"mode": "standard", "max_attempts": 4}, connect_timeout=5, read_timeout=30)
OFFLINE_CREDENTIALS = ("testing", "testing")  # the offline stack takes any; botocore wants some
# `StackOptions`' defaults (retrain/local/cloudformation/stack.py, which imports moto: a test keeps
# them equal), for commands that name the offline stack's resources without importing it.
OFFLINE_STACK_NAME = "retrain-local"
OFFLINE_REGION = "us-east-1"
START_HINT = "start one with `retrain local up` in another terminal, or name a deployed stack with --stack NAME"

StackOption = Annotated[
    str | None,
    typer.Option(
        "--stack",
        envvar="RETRAIN_STACK",
        help="A deployed CloudFormation stack (default: the offline stack of `retrain local up`).",
        show_default=False,
    ),
]
RegionOption = Annotated[
    str | None,
    typer.Option(help="AWS region of --stack (default: your AWS configuration's).", show_default=False),
]


class TargetError(RetrainError):
    """No stack to talk to, or it lacks what the command needs: said in words, exit 2."""


@dataclass(frozen=True)
class StackTarget:
    name: str
    kind: Literal["offline", "aws"]
    region: str
    endpoint_url: str | None
    outputs: dict[str, str]
    session: boto3.session.Session
    credentials: tuple[str, str] | None = None

    def client(self, service: str, config: Config = CLI_CONFIG) -> Any:
        return clients.make(
            service, session=self.session, endpoint_url=self.endpoint_url, config=config, credentials=self.credentials
        )

    def output(self, name: str) -> str:
        value = self.outputs.get(name)
        if not value:
            raise TargetError(
                f"stack {self.name} has no output {name}: deploy it again with this version's template.yaml"
            )
        return value

    def describe(self) -> str:
        if self.kind == "offline":
            return f"offline stack {self.name} at {self.endpoint_url}"
        return f"stack {self.name} in {self.region} (AWS)"


def resolve(stack: str | None, region: str | None = None) -> StackTarget:
    """The stack to use; raises TargetError saying what to do when there is none."""
    if stack:
        return _deployed(stack, region)
    # Here, not at the top: `retrain --help` and the annotators' commands import no `retrain.local`.
    from retrain.local.endpoint import discovery  # noqa: PLC0415

    found = discovery.find()
    if isinstance(found, discovery.StaleRecord):
        raise TargetError(f"the offline stack recorded in {found.path} (pid {found.pid}) has stopped; {START_HINT}")
    if found is None:
        raise TargetError(f"no offline stack is running; {START_HINT}")
    return _offline(found)


def _offline(record: LocalStackRecord) -> StackTarget:
    address = urlparse(record.endpoint_url)
    try:
        with socket.create_connection((address.hostname or "127.0.0.1", address.port or 80), timeout=2):
            pass
    except OSError as error:
        raise TargetError(
            f"the offline stack {record.stack_name} (pid {record.pid}) does not answer at {record.endpoint_url}: "
            f"{error.strerror or error}; {START_HINT}"
        ) from error
    return StackTarget(
        name=record.stack_name,
        kind="offline",
        region=record.region,
        endpoint_url=record.endpoint_url,
        outputs=dict(record.outputs),
        session=boto3.session.Session(region_name=record.region),
        credentials=OFFLINE_CREDENTIALS,
    )


def _deployed(name: str, region: str | None) -> StackTarget:
    session = boto3.session.Session(region_name=region)
    if not session.region_name:
        raise TargetError("no AWS region: pass --region or set AWS_REGION")
    try:
        cloudformation = clients.make("cloudformation", session=session, config=CLI_CONFIG)
        stacks = cloudformation.describe_stacks(StackName=name)["Stacks"]
    except NoCredentialsError as error:
        raise TargetError("no AWS credentials: configure them (aws configure, or aws sso login)") from error
    except ClientError as error:
        message = error.response.get("Error", {}).get("Message", str(error))
        if "does not exist" in message:
            raise TargetError(f"there is no stack {name} in {session.region_name}") from error
        raise TargetError(f"cannot read stack {name} in {session.region_name}: {message}") from error
    except BotoCoreError as error:
        raise TargetError(f"cannot reach CloudFormation in {session.region_name}: {error}") from error
    outputs = {item["OutputKey"]: item["OutputValue"] for item in stacks[0].get("Outputs", [])}
    return StackTarget(
        name=name, kind="aws", region=session.region_name, endpoint_url=None, outputs=outputs, session=session
    )


def connect(stack: str | None, region: str | None, console: Console) -> StackTarget:
    """`resolve` for a command: says which stack it uses on stderr, or why there is none (exit 2)."""
    try:
        target = resolve(stack, region)
    except TargetError as error:
        console.print(f"[red]{error}[/red]", soft_wrap=True)
        raise typer.Exit(2) from error
    console.print(f"[dim]using the {target.describe()}[/dim]", soft_wrap=True)
    return target
