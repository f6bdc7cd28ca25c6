"""Serve AWS calls that moto does not implement, through botocore's public event hooks.

An emulator is a function from request parameters to a response dict, registered for one
`service.Operation`. Hooks go on boto3's default session (the mechanism botocore's own Stubber
uses), so every client created from it afterwards - ours, the functions', and the ones moto's
Step Functions engine creates - reaches the emulator instead of the network. Every request and
every response is validated against botocore's service model, so an emulator cannot accept a call
that AWS would refuse, nor answer in a shape AWS never would.
"""

from __future__ import annotations

import copy
import io
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.awsrequest import AWSResponse, HTTPHeaders
from botocore.exceptions import ParamValidationError
from botocore.hooks import BaseEventHooks
from botocore.model import OperationModel
from botocore.response import StreamingBody
from botocore.validate import ParamValidator

from functions.common.errors import RetrainError
from functions.common.service_model import service_side_problems

Emulator = Callable[[dict[str, Any]], dict[str, Any]]


class EmulatedServiceError(RetrainError):
    """Raised by an emulator to answer with an AWS error (botocore turns it into a ClientError)."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status


class EmulatorContractError(RetrainError):
    """An emulator answered with a response that botocore's service model does not allow."""


@dataclass
class EmulatorRegistry:
    """The emulated operations, and the hooks that route calls to them."""

    _emulators: dict[tuple[str, str], Emulator] = field(default_factory=dict)
    _events: BaseEventHooks | None = None
    _calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def register(self, service: str, operation: str, emulator: Emulator) -> None:
        """Serve `service.operation`, both as botocore names them (`lambda`, `Invoke`)."""
        self._emulators[(service, operation)] = emulator

    @property
    def calls(self) -> list[tuple[str, str, dict[str, Any]]]:
        """Every emulated call so far, as (service, operation, parameters)."""
        with self._lock:
            return list(self._calls)

    def install(self) -> None:
        """Hook into boto3's default session; call after moto started (moto replaces it)."""
        if boto3.DEFAULT_SESSION is None:
            boto3.setup_default_session()
        assert boto3.DEFAULT_SESSION is not None
        events = boto3.DEFAULT_SESSION.events
        events.register_first(
            "before-parameter-build", self._validate_request, unique_id=f"{id(self)}-request"
        )
        events.register_first(
            "before-call",
            self._answer,  # type: ignore[arg-type]
            unique_id=f"{id(self)}-call",
        )
        self._events = events

    def uninstall(self) -> None:
        events, self._events = self._events, None
        if events is None:
            return
        events.unregister("before-parameter-build", unique_id=f"{id(self)}-request")
        events.unregister("before-call", unique_id=f"{id(self)}-call")

    def _lookup(self, model: OperationModel) -> Emulator | None:
        return self._emulators.get((model.service_model.service_name, model.name))

    def _validate_request(
        self, params: dict[str, Any], model: OperationModel, context: dict[str, Any], **_: Any
    ) -> None:
        if self._lookup(model) is None:
            return
        # Validate even when the caller turned client-side validation off (moto's engine does).
        if model.input_shape is None:
            return
        report = ParamValidator().validate(params, model.input_shape)
        if report.has_errors():
            raise ParamValidationError(report=report.generate_report())
        # What AWS checks on its side and botocore's client does not: enums, maxima, patterns.
        problems = service_side_problems(params, model.input_shape)
        if problems:
            raise ParamValidationError(report="\n".join(problems))
        context["emulated_params"] = copy.deepcopy(params)

    def _answer(
        self, model: OperationModel, context: dict[str, Any], **_: Any
    ) -> tuple[AWSResponse, dict[str, Any]] | None:
        emulator = self._lookup(model)
        if emulator is None:
            return None
        params: dict[str, Any] = context.get("emulated_params", {})
        service = model.service_model.service_name
        with self._lock:
            self._calls.append((service, model.name, params))
        try:
            parsed = emulator(params)
        except EmulatedServiceError as error:
            return _response(
                error.status, {"Error": {"Code": error.code, "Message": error.message}}
            )
        if model.output_shape is not None:
            report = ParamValidator().validate(parsed, model.output_shape)
            if report.has_errors():
                raise EmulatorContractError(
                    f"the {service}.{model.name} emulator answered outside botocore's model:\n"
                    f"{report.generate_report()}"
                )
        return _response(200, _stream_payload(model, parsed))


def _stream_payload(model: OperationModel, parsed: dict[str, Any]) -> dict[str, Any]:
    """A blob that is the whole HTTP body (Lambda's Payload) reaches callers as a stream."""
    shape = model.output_shape
    member = shape.serialization.get("payload") if shape is not None else None
    if shape is None or member is None or member not in parsed:
        return parsed
    if shape.members[member].type_name != "blob":
        return parsed
    body = parsed[member]
    data = body.encode() if isinstance(body, str) else bytes(body)
    return {**parsed, member: StreamingBody(io.BytesIO(data), len(data))}


def _response(status: int, parsed: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
    request_id = str(uuid.uuid4())
    parsed = {
        **parsed,
        "ResponseMetadata": {
            "RequestId": request_id,
            "HTTPStatusCode": status,
            "HTTPHeaders": {"x-amzn-requestid": request_id},
            "RetryAttempts": 0,
        },
    }
    return AWSResponse(url="", status_code=status, headers=HTTPHeaders(), raw=None), parsed
