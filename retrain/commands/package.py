"""`retrain package-trainer OUT [--stack NAME | --bucket NAME]`: the trainer as SageMaker gets it.

Builds `OUT/sourcedir.tar.gz` from `trainer/` (byte-identical for identical sources) and, given a
deployed stack or its data bucket, releases it: `s3://<bucket>/code/<sha256>/sourcedir.tar.gz`,
then `code/current.json` naming that digest, which every run started from then on trains with.
The bucket lets only the release path write under `code/`: with `--stack`, the command acts as
the stack's TrainerReleaseRole (assumed with your credentials; the stack's TrainerReleasers
parameter says whose); with `--bucket`, as yourself, which a deployed stack's bucket refuses
unless your credentials are already a session of that role.

Exit codes: 0 built (and released); 2 usage error, or the stack/bucket cannot be reached or written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import boto3
import typer
from botocore.exceptions import BotoCoreError, ClientError
from rich.console import Console

from functions.common import clients
from retrain import target as targets
from retrain.package import build_sourcedir, release_trainer

console = Console()
SESSION_NAME = "retrain-package-trainer"  # what CloudTrail shows for the release's writes


def command(
    out: Annotated[Path, typer.Argument(help="Folder for sourcedir.tar.gz and its .sha256.")] = Path("build/trainer"),
    stack: Annotated[
        str | None, typer.Option(help="Release to this deployed stack (as its TrainerReleaseRole).")
    ] = None,
    bucket: Annotated[
        str | None, typer.Option(help="Release to this data bucket as yourself (already the release role).")
    ] = None,
    region: Annotated[str | None, typer.Option(help="AWS region (default: your configuration's).")] = None,
) -> None:
    """Build the trainer's sourcedir.tar.gz; with --stack or --bucket, release it for training jobs."""
    archive = build_sourcedir(out)
    console.print(f"{archive.path}: {len(archive.files)} files, sha256 {archive.sha256}", soft_wrap=True)
    if stack is None and bucket is None:
        return
    try:
        s3, target = _release_client(stack, bucket, region)
        released = release_trainer(s3, target, archive)
    except (ClientError, BotoCoreError, targets.TargetError) as error:
        console.print(f"[red]cannot release the trainer:[/red] {error}", soft_wrap=True)
        raise typer.Exit(2) from error
    if released.outcome == "restored":
        console.print(
            f"[red]{released.uri} held other bytes (sha256 {released.replaced_sha256}): someone replaced the "
            "released trainer; restored. Find out who (the bucket's access logs, CloudTrail).[/red]",
            soft_wrap=True,
        )
    already = " (already there)" if released.outcome == "present" else ""
    console.print(f"released {released.uri}{already}: runs started from now on train with it", soft_wrap=True)


def _release_client(stack: str | None, bucket: str | None, region: str | None) -> tuple[Any, str]:
    """An S3 client that may write under `code/`, and the bucket to write to."""
    if stack is None:
        return clients.make("s3", session=boto3.session.Session(region_name=region)), str(bucket)
    deployed = targets.resolve(stack, region)
    role = deployed.output("TrainerReleaseRoleArn")
    sts = deployed.client("sts")
    granted = sts.assume_role(RoleArn=role, RoleSessionName=SESSION_NAME)["Credentials"]
    s3 = clients.make(
        "s3",
        session=deployed.session,
        endpoint_url=deployed.endpoint_url,
        credentials=(granted["AccessKeyId"], granted["SecretAccessKey"], granted["SessionToken"]),
    )
    return s3, bucket or deployed.output("DataBucketName")
