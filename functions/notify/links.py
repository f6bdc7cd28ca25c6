"""The links a message carries: where an engineer clicks next.

Console links are stable and work for anyone who can sign in to the account. The profiling report
also gets a presigned URL, which opens in a browser without AWS credentials. A presigned URL dies
with the credentials that signed it, and a Lambda's own credentials say nothing about when they
expire, so the link is signed with a session of the report-reader role whose expiry STS states:
the message then tells exactly how long the link works (`retrain link RUN` makes a fresh one).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from botocore.config import Config
from pydantic import BaseModel, Field

from functions.common import clients, prefixes

if TYPE_CHECKING:
    from mypy_boto3_sts import STSClient

LINK_SECONDS = 3600  # what a role session assumed by a Lambda may last (role chaining's limit)
MARGIN = timedelta(minutes=1)  # the link must not outlive the session by a clock's skew
MAX_BATCH_LINKS = 5


class Link(BaseModel):
    label: str
    url: str


class ReportLink(BaseModel):
    """A presigned link to the report, and when it stops working (true, not hoped)."""

    url: str
    expires_at: datetime
    valid_seconds: int = Field(ge=0)


class RunLinks(BaseModel):
    report: ReportLink | None = None
    report_console: str | None = None
    run_folder: str
    training_job: str | None = None
    logs: str | None = None
    execution: str | None = None
    # reports/index.html: every run, its gate verdict, mIoU over time, batches used and held.
    history: str | None = None
    batch_reports: list[Link] = Field(default_factory=list)
    more_batches: int = 0


def console_base(region: str) -> str:
    if region.startswith("cn-"):
        return f"https://{region}.console.amazonaws.cn"
    if region.startswith("us-gov-"):
        return "https://console.amazonaws-us-gov.com"
    return f"https://{region}.console.aws.amazon.com"


def s3_console(region: str, bucket: str, key: str) -> str:
    """The S3 console page of an object, or of a folder when `key` ends with `/`."""
    base = console_base(region)
    if key.endswith("/"):
        return f"{base}/s3/buckets/{bucket}?region={region}&prefix={quote(key)}&showversions=false"
    return f"{base}/s3/object/{bucket}?region={region}&prefix={quote(key)}"


def _console_path(text: str) -> str:
    """The CloudWatch console's own escaping of a path inside its URL fragment."""
    return quote(quote(text, safe=""), safe="").replace("%", "$")


def run_links(
    *,
    region: str,
    bucket: str,
    folder: str,
    job_name: str | None,
    execution_arn: str | None,
    report_key: str | None,
    batches: list[str],
    report: ReportLink | None = None,
) -> RunLinks:
    base = console_base(region)
    logs = None
    if job_name is not None:
        group = _console_path("/aws/sagemaker/TrainingJobs")
        stream = f"$3FlogStreamNameFilter$3D{job_name}"
        logs = f"{base}/cloudwatch/home?region={region}#logsV2:log-groups/log-group/{group}{stream}"
    return RunLinks(
        report=report,
        report_console=s3_console(region, bucket, report_key) if report_key else None,
        # The summary's own folder: reports/runs/<run>/, or reports/failures/<run>/ for a run
        # that ended before its evaluation.
        run_folder=s3_console(region, bucket, folder),
        history=s3_console(region, bucket, f"{prefixes.REPORTS}index.html"),
        training_job=f"{base}/sagemaker/home?region={region}#/jobs/{job_name}" if job_name else None,
        logs=logs,
        execution=f"{base}/states/home?region={region}#/v2/executions/details/{execution_arn}"
        if execution_arn
        else None,
        batch_reports=[
            Link(label=batch, url=s3_console(region, bucket, prefixes.report_key(batch, "report.md")))
            for batch in batches[:MAX_BATCH_LINKS]
        ],
        more_batches=max(0, len(batches) - MAX_BATCH_LINKS),
    )


def presign_report(
    *, sts: STSClient, role_arn: str, run: str, bucket: str, key: str, now: datetime, seconds: int = LINK_SECONDS
) -> ReportLink:
    """A presigned GET of `key`, signed by a fresh session of `role_arn`; it works until that
    session expires (or `seconds` from now, if sooner)."""
    session = sts.assume_role(
        RoleArn=role_arn, RoleSessionName=f"report-link-{run}"[:64], DurationSeconds=max(900, seconds)
    )["Credentials"]
    s3: Any = clients.make(
        "s3",
        # Signature version 4: the only one S3 accepts from new regions, and honest about expiry.
        config=clients.RETRY_CONFIG.merge(Config(signature_version="s3v4")),
        credentials=(session["AccessKeyId"], session["SecretAccessKey"], session["SessionToken"]),
    )
    lifetime = int(min(timedelta(seconds=seconds), session["Expiration"] - now - MARGIN).total_seconds())
    lifetime = max(lifetime, 0)
    url: str = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=lifetime)
    return ReportLink(url=url, expires_at=now + timedelta(seconds=lifetime), valid_seconds=lifetime)
