"""The boto3 clients the offline stack itself uses (not the functions': see functions/common)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import boto3

from functions.common import clients

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_fsx import FSxClient
    from mypy_boto3_logs import CloudWatchLogsClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_secretsmanager import SecretsManagerClient
    from mypy_boto3_sns import SNSClient
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_stepfunctions import SFNClient


@dataclass(frozen=True)
class StackClients:
    s3: S3Client
    sqs: SQSClient
    sns: SNSClient
    dynamodb: DynamoDBClient
    secretsmanager: SecretsManagerClient
    stepfunctions: SFNClient
    logs: CloudWatchLogsClient
    # On boto3's default session: their calls reach the offline stack's emulators.
    fsx: FSxClient
    sagemaker: SageMakerClient
    # PutEvents reaches the stack's event bus (moto keeps the rules but calls no Lambda target).
    events: EventBridgeClient
    # Untyped: the project installs no stubs for these, used only to create resources.
    kms: Any
    ec2: Any
    cloudwatch: Any
    sts: Any

    @classmethod
    def create(cls, *, region: str, endpoint_url: str | None) -> StackClients:
        session = boto3.session.Session(region_name=region)

        def client(service: str):  # type: ignore[no-untyped-def]
            return clients.make(service, session=session, endpoint_url=endpoint_url)

        return cls(
            s3=client("s3"),
            sqs=client("sqs"),
            sns=client("sns"),
            dynamodb=client("dynamodb"),
            secretsmanager=client("secretsmanager"),
            stepfunctions=client("stepfunctions"),
            logs=client("logs"),
            fsx=clients.make("fsx", endpoint_url=endpoint_url),
            sagemaker=clients.make("sagemaker", endpoint_url=endpoint_url),
            events=clients.make("events", endpoint_url=endpoint_url),
            kms=client("kms"),
            ec2=client("ec2"),
            cloudwatch=client("cloudwatch"),
            sts=client("sts"),
        )
