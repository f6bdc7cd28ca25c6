"""`retrain package-trainer OUT [--stack NAME | --bucket NAME]`: the trainer as SageMaker gets it.

Builds `OUT/sourcedir.tar.gz` from `trainer/` (byte-identical for identical sources) and, given a
deployed stack or its data bucket, uploads it to `s3://<bucket>/code/sourcedir.tar.gz` with its
sha256 in the object's metadata, where every training job of the stack runs it from.

Exit codes: 0 built (and uploaded); 2 usage error or the stack/bucket cannot be reached.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from botocore.exceptions import BotoCoreError, ClientError
from rich.console import Console

from functions.common import clients, prefixes
from retrain.package import build_sourcedir

console = Console()


def command(
    out: Annotated[Path, typer.Argument(help="Folder for sourcedir.tar.gz and its .sha256.")] = Path("build/trainer"),
    stack: Annotated[
        str | None, typer.Option(help="Upload to this deployed stack's data bucket (from its outputs).")
    ] = None,
    bucket: Annotated[str | None, typer.Option(help="Upload to this data bucket.")] = None,
    region: Annotated[str | None, typer.Option(help="AWS region (default: your configuration's).")] = None,
) -> None:
    """Build the trainer's sourcedir.tar.gz; with --stack or --bucket, upload it for training jobs."""
    archive = build_sourcedir(out)
    console.print(f"{archive.path}: {len(archive.files)} files, sha256 {archive.sha256}", soft_wrap=True)
    if stack is None and bucket is None:
        return
    try:
        target = bucket or _stack_bucket(stack or "", region)
        s3: Any = clients.make("s3", session=_session(region))
        s3.put_object(
            Bucket=target,
            Key=prefixes.TRAINER_CODE,
            Body=archive.path.read_bytes(),
            Metadata={"sha256": archive.sha256},
        )
    except (ClientError, BotoCoreError) as error:
        console.print(f"[red]cannot upload the trainer:[/red] {error}", soft_wrap=True)
        raise typer.Exit(2) from error
    console.print(f"uploaded to s3://{target}/{prefixes.TRAINER_CODE}", soft_wrap=True)


def _session(region: str | None) -> Any:
    import boto3  # noqa: PLC0415

    return boto3.session.Session(region_name=region)


def _stack_bucket(stack: str, region: str | None) -> str:
    cloudformation: Any = clients.make("cloudformation", session=_session(region))
    (described,) = cloudformation.describe_stacks(StackName=stack)["Stacks"]
    outputs = {item["OutputKey"]: item["OutputValue"] for item in described.get("Outputs", [])}
    if "DataBucketName" not in outputs:
        raise typer.BadParameter(f"stack {stack} has no DataBucketName output: is it this project's?")
    return str(outputs["DataBucketName"])
