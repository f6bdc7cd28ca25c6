"""The emulators, served over HTTP to clients outside the stack's process.

The emulators answer inside the stack's process, on boto3's hooks (`emulators.py`). A person in
another terminal (`aws sagemaker describe-training-job --endpoint-url ...`, `retrain runs cancel`)
reaches only the HTTP server, where moto would answer with its own, different SageMaker. This WSGI
layer in front of moto's app takes the requests of emulated JSON-protocol operations
(`X-Amz-Target: SageMaker.StopTrainingJob`), and Lambda's `Invoke` (REST: `POST
/2015-03-31/functions/NAME/invocations`, `retrain runs start`), replays each as a call of an
in-process client, so it passes the same request validation, emulator and response validation as
the stack's own calls, and writes the answer back as the protocol does. Everything else goes on to
moto unchanged.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, unquote

import botocore.session
from botocore.config import Config
from botocore.exceptions import ClientError, ParamValidationError
from botocore.model import Shape
from cheroot import wsgi
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

from functions.common import clients
from retrain.local.endpoint.emulators import EmulatorRegistry

log = logging.getLogger(__name__)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
# One attempt inside: the caller outside retries (a throttled answer must reach it as one).
ONE_ATTEMPT = Config(retries={"mode": "standard", "total_max_attempts": 1}, connect_timeout=5, read_timeout=60)


# Lambda's Invoke, the one REST operation served here (its URI in botocore's model).
INVOKE_PATH = re.compile(r"^/2015-03-31/functions/(?P<name>[^/]+)/invocations$")


class EmulatorGateway:
    """WSGI middleware: emulated JSON-protocol operations here, the rest to `app` (moto)."""

    def __init__(self, app: WsgiApp, registry: EmulatorRegistry, region: str) -> None:
        self._app = app
        self._registry = registry
        self._region = region
        self._loader = botocore.session.get_session()

    def _targets(self) -> dict[str, str]:
        """`targetPrefix -> service` for the emulated services that speak the JSON protocol (looked
        up per request: emulators register after the server starts; botocore caches the models)."""
        found: dict[str, str] = {}
        for service in self._registry.services():
            model = self._loader.get_service_model(service)
            prefix = model.metadata.get("targetPrefix")
            if model.protocol == "json" and prefix:
                found[prefix] = service
        return found

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        invoked = INVOKE_PATH.match(str(environ.get("PATH_INFO", "")))
        if invoked and environ.get("REQUEST_METHOD") == "POST" and self._registry.serves("lambda", "Invoke"):
            return self._invoke(unquote(invoked["name"]), environ, start_response)
        prefix, _, operation = str(environ.get("HTTP_X_AMZ_TARGET", "")).partition(".")
        service = self._targets().get(prefix)
        if service is None or not self._registry.serves(service, operation):
            return self._app(environ, start_response)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        raw = environ["wsgi.input"].read(length) if length else b"{}"
        status, body = self._call(service, operation, raw)
        start_response(
            f"{status} {'OK' if status < 300 else 'Error'}",
            [("Content-Type", "application/x-amz-json-1.1"), ("Content-Length", str(len(body)))],
        )
        return [body]

    def _invoke(self, name: str, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        """Lambda's `Invoke` as its REST protocol has it: the event is the body, the type and
        log type are headers, the qualifier a query parameter; the answer's body is the payload."""
        length = int(environ.get("CONTENT_LENGTH") or 0)
        event = environ["wsgi.input"].read(length) if length else b""
        params: dict[str, Any] = {"FunctionName": name, "Payload": event}
        for header, member in (
            ("HTTP_X_AMZ_INVOCATION_TYPE", "InvocationType"),
            ("HTTP_X_AMZ_LOG_TYPE", "LogType"),
            ("HTTP_X_AMZ_CLIENT_CONTEXT", "ClientContext"),
        ):
            if environ.get(header):
                params[member] = environ[header]
        qualifier = parse_qs(str(environ.get("QUERY_STRING", ""))).get("Qualifier")
        if qualifier:
            params["Qualifier"] = qualifier[0]
        client = clients.make("lambda", config=ONE_ATTEMPT, endpoint_url="http://emulated.invalid")
        try:
            answer = dict(client._make_api_call("Invoke", params))
        except (ParamValidationError, ClientError) as error:
            status, code, message = _client_error(error)
            body = json.dumps({"Type": "User", "message": message}).encode()
            start_response(
                f"{status} Error",
                [("Content-Type", "application/json"), ("X-Amzn-ErrorType", code), ("Content-Length", str(len(body)))],
            )
            return [body]
        payload = answer.get("Payload")
        body = payload.read() if payload is not None else b""
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        for member, header in (
            ("FunctionError", "X-Amz-Function-Error"),
            ("ExecutedVersion", "X-Amz-Executed-Version"),
        ):
            if answer.get(member):
                headers.append((header, str(answer[member])))
        start_response(f"{answer.get('StatusCode', 200)} OK", headers)
        return [body]

    def _call(self, service: str, operation: str, raw: bytes) -> tuple[int, bytes]:
        model = self._loader.get_service_model(service).operation_model(operation)
        try:
            params = from_json(json.loads(raw or b"{}"), model.input_shape)
        except (ValueError, TypeError) as error:
            return _error(400, "SerializationException", f"the request body is not valid JSON: {error}")
        # A client of boto3's default session: its call passes the emulator registry's hooks.
        client = clients.make(service, config=ONE_ATTEMPT, endpoint_url="http://emulated.invalid")
        try:
            answer = dict(client._make_api_call(operation, params))
        except (ParamValidationError, ClientError) as error:
            return _error(*_client_error(error))
        answer.pop("ResponseMetadata", None)
        return 200, json.dumps(to_json(answer, model.output_shape)).encode()


def _client_error(error: ParamValidationError | ClientError) -> tuple[int, str, str]:
    """The status, error code and message an in-process call's error is answered with."""
    if isinstance(error, ParamValidationError):
        return 400, "ValidationException", str(error)
    details = error.response.get("Error", {})
    status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 400))
    return status, str(details.get("Code", "InternalFailure")), str(details.get("Message", ""))


def _error(status: int, code: str, message: str) -> tuple[int, bytes]:
    return status, json.dumps({"__type": code, "message": message}).encode()


def from_json(value: Any, shape: Shape | None) -> Any:
    """A JSON-protocol request body as botocore's client takes parameters (blobs decoded)."""
    if shape is None or value is None:
        return value
    kind = shape.type_name
    if kind == "structure":
        members = shape.members  # type: ignore[attr-defined]
        return {name: from_json(item, members.get(name)) for name, item in dict(value).items()}
    if kind == "list":
        return [from_json(item, shape.member) for item in value]  # type: ignore[attr-defined]
    if kind == "map":
        return {key: from_json(item, shape.value) for key, item in dict(value).items()}  # type: ignore[attr-defined]
    if kind == "blob":
        return base64.b64decode(value)
    return value  # timestamps stay numbers: botocore's validator and serializer accept epochs


def to_json(value: Any, shape: Shape | None) -> Any:  # noqa: PLR0911 (one return per shape kind)
    """A parsed answer as the JSON protocol writes it: timestamps in epoch seconds, blobs base64."""
    if shape is None or value is None:
        return value
    kind = shape.type_name
    if kind == "structure":
        members = shape.members  # type: ignore[attr-defined]
        return {name: to_json(item, members.get(name)) for name, item in value.items() if name in members}
    if kind == "list":
        return [to_json(item, shape.member) for item in value]  # type: ignore[attr-defined]
    if kind == "map":
        return {key: to_json(item, shape.value) for key, item in value.items()}  # type: ignore[attr-defined]
    if kind == "timestamp" and isinstance(value, datetime):
        return value.timestamp()
    if kind == "blob":
        data = value.read() if hasattr(value, "read") else value
        return base64.b64encode(data if isinstance(data, bytes) else str(data).encode()).decode()
    return value


class GatewayMotoServer:
    """moto's app, with the emulator gateway in front, served on loopback by cheroot.

    moto's own `ThreadedMotoServer` runs werkzeug's development server, which closes the
    connection after every answer ("keep-alive ... isn't handled well by Python's http.server")
    and starts a thread for each new one: every AWS call of a function opened a TCP connection
    and a thread, and urllib3 found its pooled connection dropped each time. cheroot keeps
    HTTP/1.1 connections alive and answers from a fixed pool of threads, as an AWS endpoint does.
    """

    # Requests beyond the pool wait for a thread, they are not refused: an SQS long poll holds one
    # for its wait, and with worker processes every function environment has its own connections.
    THREADS = 32
    KEEP_ALIVE_CONNECTIONS = 1000

    def __init__(self, registry: EmulatorRegistry, *, region: str, ip_address: str, port: int) -> None:
        self._registry = registry
        self._region = region
        self._ip_address = ip_address
        self._port = port
        self._server: wsgi.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        app = EmulatorGateway(DomainDispatcherApplication(create_backend_app), self._registry, self._region)
        server = wsgi.Server((self._ip_address, self._port), app, numthreads=self.THREADS, server_name="retrain-local")
        # Every client (the stack's, each function's, each worker process's) keeps its own pool of
        # connections: cheroot's default of 10 kept-alive connections would close the others'.
        server.keep_alive_conn_limit = self.KEEP_ALIVE_CONNECTIONS
        server.prepare()  # bound and listening when this returns: the port is known
        self._server = server
        self._thread = threading.Thread(target=server.serve, name="aws-endpoint", daemon=True)
        self._thread.start()

    def get_host_and_port(self) -> tuple[str, int]:
        if self._server is None:
            raise RuntimeError("the AWS endpoint is not started")
        host, port = self._server.bind_addr[:2]
        return str(host), int(port)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.stop()  # closes the listening socket and the connections, joins the threads
        if self._thread is not None:
            self._thread.join(timeout=10)
