"""The one boto3 client factory: one place that knows how every AWS call is retried.

Botocore's `standard` retry mode retries throttling and transient errors with exponential backoff
and jitter; we raise the attempt count because S3 and DynamoDB throttle in bursts when an
annotation team uploads thousands of objects at once. Endpoints come from the environment
(`AWS_ENDPOINT_URL`), so the same code talks to AWS or to the offline stack. The functions use the
cached typed accessors below; the command-line tool and the offline stack call `make` with their
own session, endpoint or retry budget.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from functions.common.errors import AwsServiceBusyError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_fsx import FSxClient
    from mypy_boto3_lambda import LambdaClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_secretsmanager import SecretsManagerClient
    from mypy_boto3_sns import SNSClient
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_stepfunctions import SFNClient
    from mypy_boto3_sts import STSClient

MAX_ATTEMPTS = 8
RETRY_CONFIG = Config(
    # total_max_attempts counts the first try; botocore's `max_attempts` would count retries only
    # (9 attempts, whose backoff can outlast a 60 s function timeout).
    retries={"mode": "standard", "total_max_attempts": MAX_ATTEMPTS},
    connect_timeout=5,
    read_timeout=30,
)


def make(
    service: str,
    *,
    session: boto3.session.Session | None = None,
    endpoint_url: str | None = None,
    config: Config = RETRY_CONFIG,
    credentials: tuple[str, str] | tuple[str, str, str] | None = None,
) -> Any:
    """A client for `service`; `credentials` (key id, secret[, session token]) to sign with
    others than the configured ones (a role session; the offline stack's placeholders)."""
    key_id, secret, token = (*credentials, None)[:3] if credentials else (None, None, None)
    # boto3's default session unless told otherwise: the offline stack's emulators hook into it.
    factory = session.client if session is not None else boto3.client
    return factory(  # type: ignore[call-overload]
        service,
        endpoint_url=endpoint_url,
        config=config,
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        aws_session_token=token,
    )


@cache
def _client(service: str) -> Any:
    return make(service)


def s3() -> S3Client:
    client: S3Client = _client("s3")
    return client


def dynamodb() -> DynamoDBClient:
    client: DynamoDBClient = _client("dynamodb")
    return client


def sns() -> SNSClient:
    client: SNSClient = _client("sns")
    return client


def sqs() -> SQSClient:
    client: SQSClient = _client("sqs")
    return client


def stepfunctions() -> SFNClient:
    client: SFNClient = _client("stepfunctions")
    return client


def fsx() -> FSxClient:
    client: FSxClient = _client("fsx")
    return client


def sagemaker() -> SageMakerClient:
    client: SageMakerClient = _client("sagemaker")
    return client


def secretsmanager() -> SecretsManagerClient:
    client: SecretsManagerClient = _client("secretsmanager")
    return client


def sts() -> STSClient:
    client: STSClient = _client("sts")
    return client


def lambda_() -> LambdaClient:
    client: LambdaClient = _client("lambda")
    return client


def reset() -> None:
    """Forget cached clients: a cold start (the offline stack calls it when it starts)."""
    _client.cache_clear()


# What botocore's standard mode retries as throttling or transient, plus any 5xx answer.
_BUSY_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
        "ServiceUnavailable",
        "InternalError",
        "InternalFailure",
        "InternalServerError",
    }
)


@contextmanager
def busy_is_retryable() -> Iterator[None]:
    """Turn a throttling or 5xx answer that outlived botocore's retries into
    `AwsServiceBusyError`, which the state machine retries later with backoff; anything else
    (access denied, validation) passes through unchanged: retrying would not help."""
    try:
        yield
    except ClientError as error:
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in _BUSY_CODES or status >= 500:
            raise AwsServiceBusyError(
                f"{error.operation_name}: AWS is busy ({code or status}) after botocore's "
                f"{MAX_ATTEMPTS} attempts: {error}"
            ) from error
        raise
