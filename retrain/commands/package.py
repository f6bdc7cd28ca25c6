"""`retrain package-trainer OUT [--stack NAME | --bucket NAME]`: the trainer as SageMaker gets it.

Builds `OUT/sourcedir.tar.gz` from `trainer/` (byte-identical for identical sources) and, given a
deployed stack or its data bucket, releases it: `s3://<bucket>/code/<sha256>/sourcedir.tar.gz`,
then `code/current.json` naming that digest, which every run started from then on trains with.
The bucket lets only the release path write under `code/`: with `--stack`, the command acts as
the stack's TrainerReleaseRole (assumed with your credentials; the stack's TrainerReleasers
parameter says whose); with `--bucket`, as yourself, which a deployed stack's bucket refuses
unless your credentials are already a session of that role.

`--json` prints what was built and released as one document (`Packaged`: the archive's path, sha256
and files; the release's URI and outcome, or null without --stack or --bucket).

Exit codes: 0 built (and released); 2 usage error, or the stack/bucket cannot be reached or written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import boto3
import typer
from botocore.exceptions import BotoCoreError, ClientError
from rich.console import Console

from functions.common import clients
from retrain import target as targets
from retrain.commands.options import JsonOption, print_json
from retrain.package import Released, TrainerArchive, build_sourcedir, release_trainer

console = Console()
errors = Console(stderr=True)
SESSION_NAME = "retrain-package-trainer"  # what CloudTrail shows for the release's writes


@dataclass(frozen=True)
class Packaged:
    """What `retrain package-trainer` did: the archive built, and its release (None: not asked for)."""

    archive: TrainerArchive
    released: Released | None


def command(
    out: Annotated[Path, typer.Argument(help="Folder for sourcedir.tar.gz and its .sha256.")] = Path("build/trainer"),
    stack: Annotated[
        str | None, typer.Option(help="Release to this deployed stack (as its TrainerReleaseRole).")
    ] = None,
    bucket: Annotated[
        str | None, typer.Option(help="Release to this data bucket as yourself (already the release role).")
    ] = None,
    region: Annotated[str | None, typer.Option(help="AWS region (default: your configuration's).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Build the trainer's sourcedir.tar.gz; with --stack or --bucket, release it for training jobs."""
    # Under --json the words go to stderr: stdout carries the document alone.
    say = errors if as_json else console
    _check_out(out)
    archive = build_sourcedir(out)
    say.print(f"{archive.path}: {len(archive.files)} files, sha256 {archive.sha256}", soft_wrap=True)
    if stack is None and bucket is None:
        if as_json:
            print_json(Packaged(archive, None))
        return
    try:
        s3, target = _release_client(stack, bucket, region)
        released = release_trainer(s3, target, archive)
    except (ClientError, BotoCoreError, targets.TargetError) as error:
        errors.print(f"[red]cannot release the trainer:[/red] {error}", soft_wrap=True)
        raise typer.Exit(2) from error
    if released.outcome == "restored":
        say.print(
            f"[red]{released.uri} held other bytes (sha256 {released.replaced_sha256}): someone replaced the "
            "released trainer; restored. Find out who (the bucket's access logs, CloudTrail).[/red]",
            soft_wrap=True,
        )
    already = " (already there)" if released.outcome == "present" else ""
    say.print(f"released {released.uri}{already}: runs started from now on train with it", soft_wrap=True)
    if as_json:
        print_json(Packaged(archive, released))


def _check_out(out: Path) -> None:
    """OUT must be a folder this command may write in: said before anything is built (exit 2)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        errors.print(f"[red]cannot use {out} for the archive:[/red] {error.strerror or error}", soft_wrap=True)
        raise typer.Exit(2) from error


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
