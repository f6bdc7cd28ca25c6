"""The server stack's emulators answer clients of other processes, under the same contract."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ParamValidationError

from retrain.local.cloudformation.stack import OfflineStack, StackOptions
from retrain.local.endpoint.gateway import from_json, to_json

pytestmark = pytest.mark.slow(seconds=10)  # the longest test here, on 2 cores


def outside_client(service: str, endpoint: str, attempts: int = 4):  # type: ignore[no-untyped-def]
    """A client of its own botocore session: none of the stack's in-process hooks reach it."""
    session = boto3.session.Session(aws_access_key_id="x", aws_secret_access_key="y", region_name="us-east-1")
    config = Config(retries={"mode": "standard", "max_attempts": attempts})
    return session.client(service, endpoint_url=endpoint, config=config)  # type: ignore[call-overload]


def test_emulated_sagemaker_and_fsx_answer_other_processes_with_awss_errors_and_throttling() -> None:
    options = StackOptions(mode="server", poll=False, tick=False, upload_trainer=False, slack=False)
    with OfflineStack(options) as stack:
        assert stack.endpoint_url is not None and stack.training is not None
        sagemaker = outside_client("sagemaker", stack.endpoint_url)
        fsx = outside_client("fsx", stack.endpoint_url)

        assert fsx.describe_file_systems()["FileSystems"][0]["FileSystemId"] == stack.ref("DatasetFileSystem")
        with pytest.raises(ClientError) as missing:
            sagemaker.describe_training_job(TrainingJobName="no-such-job")
        assert missing.value.response["Error"]["Code"] == "ValidationException"
        assert missing.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400

        # Throttled twice: the outside client's own retries get through, as against AWS.
        stack.training.throttle("DescribeTrainingJob", 2)
        with pytest.raises(ClientError) as after_retries:
            sagemaker.describe_training_job(TrainingJobName="no-such-job")
        assert after_retries.value.response["Error"]["Code"] == "ValidationException"
        assert after_retries.value.response["ResponseMetadata"]["RetryAttempts"] == 2
        stack.training.throttle("DescribeTrainingJob", 5)
        with pytest.raises(ClientError, match="ThrottlingException"):
            outside_client("sagemaker", stack.endpoint_url, attempts=2).describe_training_job(TrainingJobName="j")
        assert sagemaker.list_training_jobs()["TrainingJobSummaries"] == []

        # A request botocore would send but the service refuses (a pattern it leaves to AWS).
        with pytest.raises(ClientError, match="ValidationException"):
            sagemaker.stop_training_job(TrainingJobName="has spaces")
        # What moto serves itself still reaches moto.
        assert outside_client("s3", stack.endpoint_url).head_bucket(Bucket=stack.ref("DataBucket"))
    with pytest.raises(ParamValidationError):
        sagemaker.describe_training_job()


def test_lambda_invoke_over_rest_reaches_the_stack_s_functions_with_lambda_s_answers() -> None:
    options = StackOptions(mode="server", poll=False, tick=False, upload_trainer=False, slack=False)
    with OfflineStack(options) as stack:
        assert stack.endpoint_url is not None
        functions = outside_client("lambda", stack.endpoint_url)
        trigger = stack.ref("TriggerFunction")

        answered = functions.invoke(FunctionName=trigger, Payload=b'{"source": "a test"}')
        assert answered["StatusCode"] == 200 and "FunctionError" not in answered
        assert json.loads(answered["Payload"].read())["reason"] == "no new curated pairs in closed batches"
        # The function's own error is a 200 with FunctionError, as on Lambda, never a ClientError.
        failed = functions.invoke(FunctionName=trigger, Payload=b'{"action": "release"}')
        assert failed["StatusCode"] == 200 and failed["FunctionError"] == "Unhandled"
        assert "the trigger frees no lock" in json.loads(failed["Payload"].read())["errorMessage"]
        assert functions.invoke(FunctionName=trigger, InvocationType="DryRun")["StatusCode"] == 204
        with pytest.raises(ClientError) as missing:
            functions.invoke(FunctionName="no-such-function", Payload=b"{}")
        assert missing.value.response["Error"]["Code"] == "ResourceNotFoundException"
        assert missing.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
        with pytest.raises(ClientError, match="InvalidRequestContentException"):
            functions.invoke(FunctionName=trigger, Payload=b"not json")


def test_json_protocol_values_round_trip_through_the_shapes() -> None:
    from datetime import UTC, datetime  # noqa: PLC0415

    import botocore.session  # noqa: PLC0415

    model = botocore.session.get_session().get_service_model("sagemaker").operation_model("ListTrainingJobs")
    moment = datetime(2026, 12, 3, 9, 15, tzinfo=UTC)
    answer = {"TrainingJobSummaries": [{"TrainingJobName": "j", "CreationTime": moment, "Unknown": 1}]}

    written = to_json(answer, model.output_shape)

    assert written == {"TrainingJobSummaries": [{"TrainingJobName": "j", "CreationTime": moment.timestamp()}]}
    assert from_json({"CreationTimeAfter": 1.5, "MaxResults": 3}, model.input_shape) == {
        "CreationTimeAfter": 1.5,
        "MaxResults": 3,
    }
