"""Record the AWS calls the functions make, and what IAM permissions each needs on AWS.

Every client `functions.common.clients` hands a function gets botocore hooks that record the
operation, its parameters and its answer; the offline Lambda runtime says which function is
running (one at a time in-process); `operator_calls` records an operator's command the same way.
`needs` maps a call to the actions and resource ARNs AWS authorises it against, with the
request's condition keys: what the function's (or the operator's) role must allow.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any
from urllib.parse import unquote

import botocore.client
import botocore.exceptions
import pytest

from functions.common import clients
from retrain.local.lambda_runtime import lambdas
from tests.iam import Need


@dataclass(frozen=True)
class Call:
    function: str  # the function's name in the offline stack
    service: str
    operation: str
    params: dict[str, Any]
    parsed: dict[str, Any]
    status: int


class CallRecorder:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._running: list[str] = []
        self._lock = threading.Lock()

    @contextmanager
    def install(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        made = clients.make
        recorder = self

        @cache
        def recording_client(service: str) -> Any:
            client = made(service)
            client.meta.events.register("before-parameter-build", recorder._before)
            client.meta.events.register("after-call", recorder._after)
            return client

        original_call: Callable[..., Any] = lambdas.call_handler

        def call_handler(handler: Any, event: Any, context: Any) -> Any:
            with self._lock:
                self._running.append(context.function_name)
            try:
                return original_call(handler, event, context)
            finally:
                with self._lock:
                    self._running.pop()

        monkeypatch.setattr(clients, "_client", recording_client)
        monkeypatch.setattr(lambdas, "call_handler", call_handler)
        yield

    def _before(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        # The body of a PutObject is not needed (and may be a stream).
        context["recorded_params"] = {key: value for key, value in params.items() if key != "Body"}

    def _after(self, http_response: Any, parsed: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        with self._lock:
            running = self._running[-1] if self._running else "(no function)"
            self.calls.append(
                Call(
                    running,
                    model.service_model.service_name,
                    model.name,
                    context.get("recorded_params", {}),
                    {key: value for key, value in parsed.items() if key not in {"Body", "Payload"}},
                    int(getattr(http_response, "status_code", 0) or 0),
                )
            )


@contextmanager
def operator_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Call]]:
    """Every AWS call this thread makes meanwhile (an operator's command run in-process), from
    whatever client it makes; the offline stack's own threads are left out."""
    calls: list[Call] = []
    thread = threading.current_thread()
    original = botocore.client.BaseClient._make_api_call

    def recording(client: Any, operation: str, params: dict[str, Any]) -> Any:
        status, parsed = 200, {}
        try:
            answer: Any = original(client, operation, params)
        except botocore.exceptions.ClientError as error:
            status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 400))
            parsed = dict(error.response)
            raise
        else:
            parsed = dict(answer)
            return answer
        finally:
            if threading.current_thread() is thread:
                recorded = {key: value for key, value in params.items() if key != "Body"}
                calls.append(
                    Call("(operator)", client.meta.service_model.service_name, operation, recorded, parsed, status)
                )

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", recording)
    try:
        yield calls
    finally:
        monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", original)


class UnmodelledCallError(AssertionError):
    """A call `needs` does not know: add it (and to the template and declaration) before using it."""


def needs(call: Call, *, region: str, account: str, key_arn: str) -> list[Need]:
    """What IAM must allow for `call` (per the Service Authorization Reference)."""
    service, operation, params = call.service, call.operation, call.params
    arn = f"arn:aws:{{}}:{region}:{account}:"
    error = str(call.parsed.get("Error", {}).get("Code", ""))
    ok = call.status < 300
    via_s3 = {"kms:ViaService": f"s3.{region}.amazonaws.com"}
    if service == "s3":
        bucket = f"arn:aws:s3:::{params['Bucket']}"
        obj = f"{bucket}/{params.get('Key', '')}"
        versioned = bool(params.get("VersionId"))
        found: list[Need] = []
        if operation in {"GetObject", "HeadObject"}:
            found.append(Need("s3:GetObjectVersion" if versioned else "s3:GetObject", obj))
            if operation == "GetObject" and ok:
                found.append(Need("kms:Decrypt", key_arn, via_s3))
            if call.status == 404 or error in {"NoSuchKey", "NoSuchVersion", "404"}:
                # Answered 404, not 403, because the caller may list the bucket.
                found.append(Need("s3:ListBucket", bucket))
        elif operation in {"PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"}:
            conditional = {"s3:if-none-match": params["IfNoneMatch"]} if params.get("IfNoneMatch") else {}
            found += [Need("s3:PutObject", obj, conditional), Need("kms:GenerateDataKey", key_arn, via_s3)]
        elif operation in {"CopyObject", "UploadPartCopy"}:
            source = params["CopySource"]
            if isinstance(source, str):
                path, _, query = unquote(source).partition("?versionId=")
                source = {"Bucket": path.split("/", 1)[0], "Key": path.split("/", 1)[1], "VersionId": query}
            source_arn = f"arn:aws:s3:::{source['Bucket']}/{source['Key']}"
            found += [
                Need("s3:GetObjectVersion" if source.get("VersionId") else "s3:GetObject", source_arn),
                Need("s3:PutObject", obj),
                Need("kms:Decrypt", key_arn, via_s3),
                Need("kms:GenerateDataKey", key_arn, via_s3),
            ]
        elif operation == "DeleteObject":
            found.append(Need("s3:DeleteObjectVersion" if versioned else "s3:DeleteObject", obj))
        elif operation == "DeleteObjects":
            for item in params["Delete"]["Objects"]:
                action = "s3:DeleteObjectVersion" if item.get("VersionId") else "s3:DeleteObject"
                found.append(Need(action, f"{bucket}/{item['Key']}"))
        elif operation == "AbortMultipartUpload":
            found.append(Need("s3:AbortMultipartUpload", obj))
        elif operation in {"ListObjectsV2", "ListObjects"}:
            found.append(Need("s3:ListBucket", bucket, {"s3:prefix": params.get("Prefix", "")}))
        elif operation == "ListObjectVersions":
            found.append(Need("s3:ListBucketVersions", bucket, {"s3:prefix": params.get("Prefix", "")}))
        elif operation == "HeadBucket":
            found.append(Need("s3:ListBucket", bucket))
        elif operation == "GetBucketLifecycleConfiguration":
            found.append(Need("s3:GetLifecycleConfiguration", bucket))
        else:
            raise UnmodelledCallError(f"s3.{operation}")
        return found
    if service == "dynamodb":

        def table(name: str) -> str:
            return name if name.startswith("arn:") else arn.format("dynamodb") + f"table/{name}"

        if operation in {"GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query", "Scan", "DescribeTable"}:
            resource = table(params["TableName"])
            if params.get("IndexName"):
                resource += f"/index/{params['IndexName']}"
            leading = _leading_key(params)
            return [Need(f"dynamodb:{operation}", resource, {"dynamodb:LeadingKeys": [leading]} if leading else {})]
        if operation == "TransactWriteItems":
            kinds = {
                "Put": "PutItem",
                "Update": "UpdateItem",
                "Delete": "DeleteItem",
                "ConditionCheck": "ConditionCheckItem",
            }
            found = []
            for item in params["TransactItems"]:
                for kind, body in item.items():
                    leading = _leading_key(body)  # IAM authorises each item as its own action
                    keys = {"dynamodb:LeadingKeys": [leading]} if leading else {}
                    found.append(Need(f"dynamodb:{kinds[kind]}", table(body["TableName"]), keys))
            return found
        raise UnmodelledCallError(f"dynamodb.{operation}")
    if service == "lambda" and operation == "Invoke":
        name = params["FunctionName"]
        function = name if name.startswith("arn:") else arn.format("lambda") + f"function:{name}"
        return [Need("lambda:InvokeFunction", function)]
    if service == "stepfunctions":
        if operation == "StartExecution":
            return [Need("states:StartExecution", params["stateMachineArn"])]
        if operation == "DescribeExecution":
            return [Need("states:DescribeExecution", params["executionArn"])]
        if operation == "GetExecutionHistory":
            return [Need("states:GetExecutionHistory", params["executionArn"])]
        if operation in {"SendTaskSuccess", "SendTaskFailure", "SendTaskHeartbeat"}:
            # No resource-level permissions: the task token is the authority.
            return [Need(f"states:{operation}", "*")]
        raise UnmodelledCallError(f"stepfunctions.{operation}")
    if service == "fsx":
        task = arn.format("fsx") + "task/{}"
        if operation == "CreateDataRepositoryTask":
            created = call.parsed.get("DataRepositoryTask", {})
            found = [
                Need("fsx:CreateDataRepositoryTask", arn.format("fsx") + f"file-system/{params['FileSystemId']}"),
                Need("fsx:CreateDataRepositoryTask", created.get("ResourceARN") or task.format("(new)")),
            ]
            if params.get("Tags"):
                found.append(Need("fsx:TagResource", created.get("ResourceARN") or task.format("(new)")))
            return found
        if operation == "DescribeDataRepositoryTasks":
            return [Need("fsx:DescribeDataRepositoryTasks", task.format(t)) for t in params.get("TaskIds", ["*"])]
        if operation == "CancelDataRepositoryTask":
            return [Need("fsx:CancelDataRepositoryTask", task.format(params["TaskId"]))]
        raise UnmodelledCallError(f"fsx.{operation}")
    if service == "sagemaker":
        job = arn.format("sagemaker") + "training-job/{}"
        if operation == "CreateTrainingJob":
            name = params["TrainingJobName"].lower()
            vpc = params.get("VpcConfig", {})
            context: dict[str, Any] = {
                "sagemaker:InterContainerTrafficEncryption": str(
                    bool(params.get("EnableInterContainerTrafficEncryption"))
                ).lower(),
                "sagemaker:NetworkIsolation": str(bool(params.get("EnableNetworkIsolation"))).lower(),
            }
            if vpc:
                context["sagemaker:VpcSubnets"] = list(vpc["Subnets"])
                context["sagemaker:VpcSecurityGroupIds"] = list(vpc["SecurityGroupIds"])
            if params.get("ResourceConfig", {}).get("VolumeKmsKeyId"):
                context["sagemaker:VolumeKmsKey"] = params["ResourceConfig"]["VolumeKmsKeyId"]
            if params.get("OutputDataConfig", {}).get("KmsKeyId"):
                context["sagemaker:OutputKmsKey"] = params["OutputDataConfig"]["KmsKeyId"]
            found = [
                Need("sagemaker:CreateTrainingJob", job.format(name), context),
                Need("iam:PassRole", params["RoleArn"], {"iam:PassedToService": "sagemaker.amazonaws.com"}),
            ]
            if params.get("Tags"):
                found.append(Need("sagemaker:AddTags", job.format(name)))
            return found
        if operation in {"DescribeTrainingJob", "StopTrainingJob"}:
            return [Need(f"sagemaker:{operation}", job.format(params["TrainingJobName"].lower()))]
        if operation == "ListTrainingJobs":
            return [Need("sagemaker:ListTrainingJobs", "*")]
        if operation == "ListTags":
            return [Need("sagemaker:ListTags", params["ResourceArn"])]
        if operation == "CreateModelPackage":
            return [Need("sagemaker:CreateModelPackage", call.parsed.get("ModelPackageArn", "(new)"))]
        if operation == "ListModelPackages":
            return [Need("sagemaker:ListModelPackages", "*")]
        if operation == "DescribeModelPackage":
            return [Need("sagemaker:DescribeModelPackage", params["ModelPackageName"])]
        raise UnmodelledCallError(f"sagemaker.{operation}")
    if service == "sns" and operation == "Publish":
        via_sns = {"kms:ViaService": f"sns.{region}.amazonaws.com"}
        return [
            Need("sns:Publish", params["TopicArn"]),
            Need("kms:GenerateDataKey", key_arn, via_sns),
            Need("kms:Decrypt", key_arn, via_sns),
        ]
    if service == "secretsmanager" and operation == "GetSecretValue":
        return [Need("secretsmanager:GetSecretValue", params["SecretId"])]
    if service == "sts" and operation == "AssumeRole":
        return [Need("sts:AssumeRole", params["RoleArn"])]
    raise UnmodelledCallError(f"{service}.{operation}")


def _leading_key(params: dict[str, Any]) -> str | None:
    """The partition key value of an item or Query of the ledger's table (`pk`), as IAM's
    `dynamodb:LeadingKeys` sees it; None where this cannot tell (an index, a Scan)."""
    if params.get("IndexName"):
        return None
    item = params.get("Key") or params.get("Item") or {}
    if "pk" in item:
        return str(item["pk"]["S"])
    condition = params.get("KeyConditionExpression", "")
    for clause in condition.split(" AND "):
        name, _, value = (part.strip() for part in clause.partition("="))
        if name == "pk" and value in params.get("ExpressionAttributeValues", {}):
            return str(params["ExpressionAttributeValues"][value]["S"])
    return None
