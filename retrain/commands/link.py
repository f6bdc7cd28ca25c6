"""`retrain link RUN`: a fresh link to a run's profiling report that opens without AWS credentials.

The link is presigned with your credentials and says how long it works: at most `--expires`
(S3 takes up to 7 days), and never longer than the credentials that sign it (a role session or
SSO login ends sooner; the link dies with it). Offline: `--endpoint-url` as `retrain local up`
prints it.

`--json` prints the link as one document (`Link`: the run, bucket, key, URL, and until when it works).

Exit codes: 0 the link on stdout; 2 usage error, no such run report, or AWS unreachable.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import boto3
import typer
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from rich.console import Console

from functions.common import clients, prefixes
from retrain import target as targets
from retrain.commands.checks import run_name
from retrain.commands.data import LOOPBACK, BucketOption, EndpointOption, RegionOption
from retrain.commands.options import JsonOption, print_json
from retrain.target import StackOption

MAX_SECONDS = 7 * 24 * 3600  # what S3 accepts for a presigned URL (signature version 4)
errors = Console(stderr=True)


@dataclass(frozen=True)
class Link:
    """A presigned link to a file of a run's report folder, and how long it works."""

    run: str
    bucket: str
    key: str
    url: str
    seconds: int  # how long it works from `signed_at`
    signed_at: datetime
    expires_at: datetime
    # Shorter than --expires: the credentials that signed it end sooner, and the link with them.
    cut_by_credentials: bool


def command(  # noqa: PLR0917 (a command's options are its parameters)
    run: Annotated[str, typer.Argument(callback=run_name, help="The run (its execution name), as messages name it.")],
    stack: StackOption = None,
    bucket: BucketOption = None,
    endpoint_url: EndpointOption = None,
    region: RegionOption = None,
    expires: Annotated[int, typer.Option(min=1, max=MAX_SECONDS, help="Seconds the link should work.")] = 3600,
    name: Annotated[str, typer.Option(help="The file of the run's folder to link to.")] = "report.html",
    as_json: JsonOption = False,
) -> None:
    """Print a presigned link to reports/runs/RUN/report.html, and until when it works."""
    credentials = None
    if stack or not (bucket or endpoint_url):
        # No names given: the deployed stack named, or the offline one `retrain local up` runs.
        target = targets.connect(stack, region, errors)
        offline, session, endpoint_url = target.kind == "offline", target.session, target.endpoint_url
        try:
            bucket = target.output("DataBucketName")
        except targets.TargetError as error:
            errors.print(str(error))
            raise typer.Exit(2) from error
        credentials = target.credentials
    else:
        errors.print(f"[dim]using bucket {bucket or '(none)'} at {endpoint_url or 'AWS'}[/dim]", soft_wrap=True)
        offline = bool(endpoint_url) and (endpoint_url or "").split("//")[-1].split(":")[0] in LOOPBACK
        session = boto3.session.Session(region_name=region or (targets.OFFLINE_REGION if offline else None))
        if offline and not bucket:
            bucket = f"{targets.OFFLINE_STACK_NAME}-data-123456789012-{session.region_name}"
    if not bucket:
        errors.print("no data bucket: pass --bucket or set DATA_BUCKET, or --stack NAME")
        raise typer.Exit(2)
    if offline and credentials is None and session.get_credentials() is None:
        # The offline stack takes any credentials; botocore still wants some to sign with.
        credentials = targets.OFFLINE_CREDENTIALS
    key = prefixes.run_report_key(run, name)
    s3: Any = clients.make(
        "s3",
        session=session,
        endpoint_url=endpoint_url,
        config=clients.RETRY_CONFIG.merge(Config(signature_version="s3v4", retries={"max_attempts": 3})),
        credentials=credentials,
    )
    try:
        s3.head_object(Bucket=bucket, Key=key)
        now = datetime.now(UTC)
        seconds = expires if offline else min(expires, _credentials_left(session, now))
        url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=seconds)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in {"404", "NoSuchKey"}:
            errors.print(f"run {run} has no {name} at s3://{bucket}/{key}")
        else:
            errors.print(f"cannot sign the link: {error}")
        raise typer.Exit(2) from error
    except BotoCoreError as error:
        errors.print(f"cannot sign the link: {error}")
        raise typer.Exit(2) from error
    link = Link(
        run=run,
        bucket=bucket,
        key=key,
        url=url,
        seconds=seconds,
        signed_at=now,
        expires_at=now + timedelta(seconds=seconds),
        cut_by_credentials=seconds != expires,
    )
    if as_json:
        print_json(link)
    else:
        typer.echo(link.url)
    note = " (your credentials expire then: the link cannot outlive them)" if link.cut_by_credentials else ""
    errors.print(f"works until {link.expires_at:%Y-%m-%d %H:%M} UTC, {seconds} s{note}", soft_wrap=True)


def _credentials_left(session: boto3.session.Session, now: datetime) -> int:
    """Seconds the signing credentials still have (long-lived keys: no limit of their own)."""
    credentials = session.get_credentials()
    if credentials is None:
        raise BotoCoreError()
    # botocore keeps the expiry of refreshable credentials (role sessions, SSO) here; it has no
    # public accessor, and a link signed with them dies when they do.
    expiry = getattr(credentials, "_expiry_time", None)
    if expiry is None:
        return MAX_SECONDS
    return max(0, int((expiry - now).total_seconds()) - 60)
