"""`retrain link RUN --json`: the presigned link to a run's report, and until when it works, as
one document (on moto's S3, in process; the offline stack's own test is in
tests/integration/test_local_commands.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from urllib.parse import parse_qs, urlparse

import boto3
import pytest
from moto import mock_aws
from typer.testing import CliRunner

from retrain.cli import app

BUCKET = "retrain-data-123456789012-us-east-1"
RUN = "ds-20261203-091500-4f1c2a9b"
KEY = f"reports/runs/{RUN}/report.html"


@pytest.fixture
def bucket() -> Iterator[None]:
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        s3.put_object(Bucket=BUCKET, Key=KEY, Body=b"<html>the report</html>")
        yield


def test_link_json_names_the_run_its_report_the_url_and_until_when_it_works(bucket: None) -> None:
    result = CliRunner().invoke(app, ["link", RUN, "--bucket", BUCKET, "--expires", "600", "--json"])

    assert result.exit_code == 0, result.output
    link = json.loads(result.stdout)
    assert (link["run"], link["bucket"], link["key"], link["seconds"]) == (RUN, BUCKET, KEY, 600)
    assert link["cut_by_credentials"] is False, "long-lived keys do not shorten a link"
    url = urlparse(link["url"])
    assert url.path.endswith(KEY) and parse_qs(url.query)["X-Amz-Expires"] == ["600"]
    signed, expires = datetime.fromisoformat(link["signed_at"]), datetime.fromisoformat(link["expires_at"])
    assert expires - signed == timedelta(seconds=600)
    assert "works until" in result.stderr, "the words stay on stderr"


def test_link_json_to_a_missing_report_is_no_document_and_exit_2(bucket: None) -> None:
    result = CliRunner().invoke(app, ["link", "ds-no-such-run", "--bucket", BUCKET, "--json"])

    assert result.exit_code == 2
    assert result.stdout == "" and "has no report.html" in result.stderr
