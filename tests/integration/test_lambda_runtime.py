"""Functions run in-process the way Lambda runs them: own environment, real API contract."""

from __future__ import annotations

import json
import os
import threading

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ParamValidationError

from retrain.local.cloudformation.stack import OfflineStack
from retrain.local.endpoint.emulators import EmulatorContractError
from retrain.local.lambda_runtime.contract import FunctionSpec
from tests.integration.helpers import add_test_function

NAMES = ["LEDGER_TABLE", "POWERTOOLS_SERVICE_NAME", "DATA_BUCKET", "ONLY_IN_A"]


def test_each_function_sees_only_the_environment_the_template_gives_it(stack: OfflineStack) -> None:
    intake = stack.runtime.spec("retrain-local-IntakeFunction").environment
    sync = stack.runtime.spec("retrain-local-DatasetSyncFunction").environment
    assert intake["LEDGER_TABLE"] == stack.ref("LedgerTable")
    assert "LEDGER_TABLE" not in sync
    assert intake["DATA_BUCKET"] == sync["DATA_BUCKET"] == stack.ref("DataBucket")  # Globals

    add_test_function(stack, "fn-a", "show_environment", ONLY_IN_A="a", POWERTOOLS_SERVICE_NAME="a")
    add_test_function(stack, "fn-b", "show_environment", POWERTOOLS_SERVICE_NAME="b")

    seen_by_a = stack.runtime.invoke("fn-a", {"names": NAMES}).payload
    seen_by_b = stack.runtime.invoke("fn-b", {"names": NAMES}).payload

    assert seen_by_a["ONLY_IN_A"] == "a"
    assert seen_by_b["ONLY_IN_A"] is None
    assert (seen_by_a["POWERTOOLS_SERVICE_NAME"], seen_by_b["POWERTOOLS_SERVICE_NAME"]) == (
        "a",
        "b",
    )
    assert "ONLY_IN_A" not in os.environ  # nothing leaks into the hosting process either


def test_lambda_invoke_reaches_the_real_handler_with_the_api_shapes(stack: OfflineStack) -> None:
    lambda_client = boto3.client("lambda", region_name="us-east-1")
    arn = add_test_function(stack, "checker", "check_job")

    response = lambda_client.invoke(FunctionName=arn, Payload=json.dumps({"polls_needed": 1}))

    assert response["StatusCode"] == 200
    assert "FunctionError" not in response
    assert json.load(response["Payload"]) == {"done": True, "polls": 1}


def test_a_handler_exception_comes_back_as_a_function_error_named_by_its_class(
    stack: OfflineStack,
) -> None:
    lambda_client = boto3.client("lambda", region_name="us-east-1")
    add_test_function(stack, "broken", "always_broken")

    response = lambda_client.invoke(FunctionName="broken", Payload=b'{"job": "j1"}')

    assert response["FunctionError"] == "Unhandled"
    error = json.load(response["Payload"])
    assert error["errorType"] == "JobStillBrokenError"
    assert error["errorMessage"] == "attempt for j1 failed"


def test_invoking_a_function_the_template_does_not_declare_is_a_not_found_error(
    stack: OfflineStack,
) -> None:
    lambda_client = boto3.client("lambda", region_name="us-east-1")

    with pytest.raises(ClientError) as raised:
        lambda_client.invoke(FunctionName="nobody")

    assert raised.value.response["Error"]["Code"] == "ResourceNotFoundException"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_requests_are_validated_against_botocore_even_with_validation_turned_off(
    stack: OfflineStack,
) -> None:
    # moto's Step Functions engine creates its clients with parameter_validation=False.
    lax = boto3.client("lambda", region_name="us-east-1", config=Config(parameter_validation=False))
    add_test_function(stack, "checker", "check_job")

    with pytest.raises(ParamValidationError, match="Payload"):
        lax.invoke(FunctionName="checker", Payload=42)  # type: ignore[arg-type]
    with pytest.raises(ParamValidationError, match="InvocationType: 'Sometimes' is not one of"):
        lax.invoke(FunctionName="checker", InvocationType="Sometimes")  # type: ignore[arg-type]
    with pytest.raises(ParamValidationError, match=r"FunctionName: .* does not match"):
        lax.invoke(FunctionName="no spaces allowed")


def test_an_emulator_answering_outside_the_model_is_caught(stack: OfflineStack) -> None:
    stack.emulators.register("lambda", "GetAccountSettings", lambda params: {"AccountLimit": "lots"})
    lambda_client = boto3.client("lambda", region_name="us-east-1")

    with pytest.raises(EmulatorContractError, match="AccountLimit"):
        lambda_client.get_account_settings()


def test_a_function_running_past_its_timeout_fails_as_timed_out(stack: OfflineStack) -> None:
    stack.runtime.add(FunctionSpec("Slow", "slow", "tests.integration.handlers.sleepy", {}, timeout_seconds=1))

    invocation = stack.runtime.invoke("slow", {"seconds": 1.2})

    assert invocation.error_type == "Sandbox.Timedout"
    assert invocation.payload["errorMessage"] == "Task timed out after 1.00 seconds"


def test_invocations_from_several_threads_run_one_at_a_time(stack: OfflineStack) -> None:
    add_test_function(stack, "fn-a", "show_environment", ONLY_IN_A="a")
    add_test_function(stack, "fn-b", "show_environment")
    results: list[tuple[str, dict[str, str | None]]] = []

    def call(name: str) -> None:
        results.extend((name, stack.runtime.invoke(name, {"names": ["ONLY_IN_A"]}).payload) for _ in range(20))

    threads = [threading.Thread(target=call, args=(name,)) for name in ("fn-a", "fn-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(results) == 40
    for name, seen in results:
        assert seen["ONLY_IN_A"] == ("a" if name == "fn-a" else None), name
