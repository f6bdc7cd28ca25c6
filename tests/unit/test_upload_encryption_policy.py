"""The data bucket insists on the stack's key for uploads: what an annotator's PutObject under
incoming/ carries decides whether the bucket policy denies it.

The policy is read from template.yaml and its conditions evaluated as IAM documents them, for the
operators it uses: a key absent from the request matches `Null: "true"`, never `StringEquals`, and
always a negated operator such as `StringNotEquals` (which is why each Deny also asks, with `Null`,
that its header be there). moto ignores conditions, so this is the only place they run before AWS.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest

from retrain.local.cloudformation.template import Created
from tests import iam

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "retrain-data-123456789012-us-east-1"
STACK_KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
OTHER_KEY = "arn:aws:kms:us-east-1:999999999999:key/00000000-0000-0000-0000-000000000000"
SSE = "s3:x-amz-server-side-encryption"
KMS_KEY = "s3:x-amz-server-side-encryption-aws-kms-key-id"
SSE_C = "s3:x-amz-server-side-encryption-customer-algorithm"


def _policy() -> list[dict[str, Any]]:
    body = iam.template().body
    resolver = iam.fake_resolver(body)
    resolver.created["DataBucket"] = Created(ref=BUCKET)
    resolver.created["DataKey"] = Created(ref="1234abcd", attributes={"Arn": STACK_KEY})
    document = resolver.resolve(body["Resources"]["DataBucketPolicy"]["Properties"]["PolicyDocument"])
    return list(document["Statement"])


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _holds(operator: str, key: str, expected: Any, context: dict[str, str]) -> bool:
    present, values = key in context, [str(v) for v in _listed(expected)]
    if operator == "Null":
        return present != (values[0] == "true")
    if operator == "StringEquals":
        return present and context[key] in values
    if operator == "StringNotEquals":
        return not present or context[key] not in values
    if operator == "Bool":
        return present and context[key].lower() in values
    raise AssertionError(f"this test does not evaluate {operator}: teach it, from IAM's documentation")


def _denied(statements: list[dict[str, Any]], key: str, context: dict[str, str]) -> list[str]:
    """The Sids of the Deny statements that refuse a PutObject of `key` with these headers."""
    resource = f"arn:aws:s3:::{BUCKET}/{key}"
    return [
        statement["Sid"]
        for statement in statements
        if statement["Effect"] == "Deny"
        and any(fnmatchcase("s3:PutObject", action) for action in _listed(statement["Action"]))
        and any(fnmatchcase(resource, pattern) for pattern in _listed(statement["Resource"]))
        and all(
            _holds(operator, condition_key, expected, context)
            for operator, conditions in statement.get("Condition", {}).items()
            for condition_key, expected in conditions.items()
        )
    ]


TLS = {"aws:SecureTransport": "true"}


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="no headers: the bucket's default, the stack's key"),
        pytest.param({SSE: "aws:kms", KMS_KEY: STACK_KEY}, id="the stack's key, named by its ARN"),
    ],
)
def test_an_upload_the_intake_can_read_is_let_in(headers: dict[str, str]) -> None:
    assert _denied(_policy(), "incoming/munich/images/a.jpg", {**TLS, **headers}) == []


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({SSE: "AES256"}, id="SSE-S3"),
        pytest.param({SSE: "aws:kms:dsse"}, id="dual-layer SSE-KMS"),
        pytest.param({SSE: "aws:kms"}, id="aws:kms without a key: the AWS managed key aws/s3"),
        pytest.param({SSE: "aws:kms", KMS_KEY: OTHER_KEY}, id="another KMS key"),
        pytest.param({SSE: "aws:kms", KMS_KEY: "1234abcd-12ab-34cd-56ef-1234567890ab"}, id="a key id, not the ARN"),
        pytest.param(
            {SSE: "aws:kms", KMS_KEY: "alias/retrain-data"}, id="an alias, resolved in the uploader's account"
        ),
        pytest.param({SSE_C: "AES256"}, id="SSE-C"),
    ],
)
def test_an_upload_the_intake_could_not_read_is_denied_at_the_bucket(headers: dict[str, str]) -> None:
    assert _denied(_policy(), "incoming/munich/images/a.jpg", {**TLS, **headers}) != []


def test_the_upload_rules_are_for_the_landing_zone_only() -> None:
    # The stack's own writes elsewhere send no encryption headers anyway; the rules say what they guard.
    assert _denied(_policy(), "reports/batches/munich-1/report.json", {**TLS, SSE: "AES256"}) == []
