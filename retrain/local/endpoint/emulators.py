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
import json
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
    _pending: dict[str, _Pending] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def register(self, service: str, operation: str, emulator: Emulator) -> None:
        """Serve `service.operation`, both as botocore names them (`lambda`, `Invoke`)."""
        self._emulators[(service, operation)] = emulator

    def serves(self, service: str, operation: str) -> bool:
        return (service, operation) in self._emulators

    def services(self) -> set[str]:
        return {service for service, _ in self._emulators}

    @property
    def calls(self) -> list[tuple[str, str, dict[str, Any]]]:
        """Every emulated call so far, as (service, operation, parameters)."""
        with self._lock:
            return list(self._calls)

    def install(self) -> None:
        """Hook into boto3's default session; call after moto started (moto replaces it).

        The answer is given at `before-send`, inside botocore's retry loop, so a throttled
        emulated call is retried by botocore exactly as a throttled AWS call is. The request is
        first pointed at a host nobody serves, so that moto's own stubber (which also listens on
        `before-send`, and botocore calls every handler) leaves it alone.
        """
        if boto3.DEFAULT_SESSION is None:
            boto3.setup_default_session()
        assert boto3.DEFAULT_SESSION is not None
        events = boto3.DEFAULT_SESSION.events
        hooks: list[tuple[str, Any]] = [
            ("before-parameter-build", self._validate_request),
            ("before-call", self._mark),
            ("before-send", self._answer),
            ("before-parse", self._parsed),
            ("after-call", self._forget),
            ("after-call-error", self._forget),
        ]
        for event, handler in hooks:
            events.register_first(event, handler, unique_id=f"{id(self)}-{event}")
        self._events = events

    def uninstall(self) -> None:
        events, self._events = self._events, None
        if events is None:
            return
        for event in (
            "before-parameter-build",
            "before-call",
            "before-send",
            "before-parse",
            "after-call",
            "after-call-error",
        ):
            events.unregister(event, unique_id=f"{id(self)}-{event}")

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

    def _mark(self, model: OperationModel, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        emulator = self._lookup(model)
        if emulator is None:
            return
        token = uuid.uuid4().hex
        with self._lock:
            self._pending[token] = _Pending(model, emulator, context.get("emulated_params", {}))
        context["emulated_token"] = token
        params["url"] = f"https://{EMULATED_HOST}/{token}"
        params.setdefault("headers", {})[TOKEN_HEADER] = token

    def _answer(self, request: Any, **_: Any) -> AWSResponse | None:
        token = request.headers.get(TOKEN_HEADER)
        if token is None:
            return None
        token = token.decode() if isinstance(token, bytes) else str(token)
        with self._lock:
            pending = self._pending.get(token)
        if pending is None:
            return None
        model = pending.model
        service = model.service_model.service_name
        with self._lock:
            self._calls.append((service, model.name, pending.params))
        try:
            parsed = pending.emulator(pending.params)
            status = 200
        except EmulatedServiceError as error:
            parsed, status = {"Error": {"Code": error.code, "Message": error.message}}, error.status
        else:
            if model.output_shape is not None:
                report = ParamValidator().validate(parsed, model.output_shape)
                if report.has_errors():
                    raise EmulatorContractError(
                        f"the {service}.{model.name} emulator answered outside botocore's model:\n"
                        f"{report.generate_report()}"
                    )
            parsed = _stream_payload(model, parsed)
        pending.answer = parsed
        # The body is parsed by the protocol's parser and then replaced (`before-parse`); an
        # error status is what makes botocore look for a retryable code in the answer.
        headers = HTTPHeaders()
        headers[TOKEN_HEADER] = token
        headers["x-amzn-requestid"] = str(uuid.uuid4())
        headers["Content-Type"] = "application/x-amz-json-1.1"
        body = json.dumps({"__type": parsed["Error"]["Code"]} if status >= 300 else {}).encode()
        return AWSResponse(url=request.url, status_code=status, headers=headers, raw=_Raw(body))

    def _parsed(self, response_dict: dict[str, Any], customized_response_dict: dict[str, Any], **_: Any) -> None:
        token = response_dict.get("headers", {}).get(TOKEN_HEADER)
        if token is None:
            return
        with self._lock:
            pending = self._pending.get(token)
        if pending is not None and pending.answer is not None:
            customized_response_dict.update(pending.answer)

    def _forget(self, context: dict[str, Any], **_: Any) -> None:
        token = context.get("emulated_token")
        if token is not None:
            with self._lock:
                self._pending.pop(token, None)


EMULATED_HOST = "emulated.retrain.invalid"
TOKEN_HEADER = "x-retrain-emulated"  # noqa: S105 (a header name, not a secret)


@dataclass
class _Pending:
    """One emulated call between botocore's `before-call` and its end (retries included)."""

    model: OperationModel
    emulator: Emulator
    params: dict[str, Any]
    answer: dict[str, Any] | None = None


class _Raw:
    """The smallest urllib3-like body botocore reads a response from."""

    def __init__(self, body: bytes) -> None:
        self._stream = io.BytesIO(body)

    def stream(self, chunk_size: int = 1024, decode_content: bool = True) -> Any:
        while chunk := self._stream.read(chunk_size):
            yield chunk

    def read(self, *args: Any, **kwargs: Any) -> bytes:
        return self._stream.read(*args)


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
