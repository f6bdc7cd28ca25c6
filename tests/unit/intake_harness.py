"""The intake as logic on a real (emulated) ledger and bucket: no stack, no queue, a settable clock.

A ledger table with the template's key schema and a versioned bucket, under mock_aws. Tests hand
the Intake the object events themselves, in the order (and as often) they choose.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import boto3
from moto import mock_aws

from functions.common.models import S3ObjectEvent
from functions.data.ledger import Ledger
from functions.data.storage import COPY_OBJECT_MAX_BYTES, DataBucket
from functions.intake.logic import Intake
from functions.validation import DEFAULT_CONFIG, FileChecker, ValidationConfig, check_in_process
from retrain.local.cloudformation.stack import create_ledger_table

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_s3 import S3Client

BUCKET = "intake-test-data"
LEDGER = "ledger"
UPLOADED = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


@dataclass
class Harness:
    intake: Intake
    s3: S3Client
    dynamodb: DynamoDBClient
    clock: list[datetime]  # what the intake's clock reads: clock[0]
    data_key_arn: str | None = None  # the stack's KMS key, when the bucket has one (`encrypted`)

    def upload(self, key: str, body: bytes, sequencer: str | None = None, **extra: Any) -> S3ObjectEvent:
        """Put one object as an annotator does (`extra`: more PutObject arguments, such as its
        encryption); the event S3 sends for it."""
        version = self.s3.put_object(Bucket=BUCKET, Key=key, Body=body, **extra)["VersionId"]
        return S3ObjectEvent(
            bucket=BUCKET,
            key=key,
            size=len(body),
            version_id=version,
            sequencer=sequencer,
            event_name="ObjectCreated:Put",
        )

    def body(self, key: str) -> bytes:
        return self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()

    def versions(self, prefix: str) -> list[tuple[str, str]]:
        """(key, VersionId) of every version under `prefix`, delete markers included."""
        listed = self.s3.list_object_versions(Bucket=BUCKET, Prefix=prefix)
        entries = [*listed.get("Versions", []), *listed.get("DeleteMarkers", [])]
        return sorted((entry["Key"], entry["VersionId"]) for entry in entries)


@contextmanager
def emulated_intake(
    bucket_type: type[DataBucket] = DataBucket,
    *,
    config: ValidationConfig = DEFAULT_CONFIG,
    multipart_threshold: int = COPY_OBJECT_MAX_BYTES,
    encrypted: bool = False,
    check_file: FileChecker = check_in_process,
) -> Iterator[Harness]:
    """An Intake whose bucket is a `bucket_type` (a subclass can make a call fail), copying objects
    above `multipart_threshold` bytes in parts; `encrypted`: the bucket's default encryption is a
    KMS key of its own, the one the intake accepts, as the template has it; `check_file`: how it
    checks a file (the Lambda's is a `DecoderProcess`)."""
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        key_arn = None
        if encrypted:
            key_arn = boto3.client("kms", region_name="us-east-1").create_key()["KeyMetadata"]["Arn"]
            default = {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key_arn}
            s3.put_bucket_encryption(
                Bucket=BUCKET,
                ServerSideEncryptionConfiguration={
                    "Rules": [{"ApplyServerSideEncryptionByDefault": default, "BucketKeyEnabled": True}]  # type: ignore[typeddict-item]
                },
            )
        create_ledger_table(dynamodb, LEDGER)
        clock = [UPLOADED]
        ledger = Ledger(dynamodb, LEDGER)
        bucket = bucket_type(s3, BUCKET, multipart_threshold=multipart_threshold, data_key_arn=key_arn)
        intake = Intake(ledger=ledger, bucket=bucket, config=config, check_file=check_file, clock=lambda: clock[0])
        yield Harness(intake, s3, dynamodb, clock, key_arn)
