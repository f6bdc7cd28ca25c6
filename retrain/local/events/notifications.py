"""What the team would receive, offline: a Slack incoming webhook on loopback, and the SNS topic.

`SlackReceiver` is a real HTTP server on 127.0.0.1 that answers like Slack's incoming webhooks
(200 "ok" to a JSON body with `text` or `blocks`, 400 "invalid_payload" otherwise) and keeps every
message. Tests make it misbehave the ways Slack can: refuse to answer, answer 5xx or 429 with
Retry-After, or answer slowly. `TopicInbox` subscribes a queue to the notification topic and
returns what arrived, as an e-mail subscriber would receive it (`retrain local up` prints it, the
demo tells it, tests read it: `OfflineStack.topic_inbox()`).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_boto3_sns import SNSClient
    from mypy_boto3_sqs import SQSClient


@dataclass
class Misbehaviour:
    """How the next requests are answered (each consumes one), instead of 200 "ok"."""

    status: int
    body: str = "error"
    delay_seconds: float = 0.0
    retry_after: int | None = None


@dataclass
class SlackReceiver:
    host: str = "127.0.0.1"
    messages: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0
    on_message: Callable[[dict[str, Any]], None] | None = None
    _plan: list[Misbehaviour] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        assert self._server is not None, "the receiver is not started"
        port = self._server.server_address[1]
        # The path looks like Slack's (/services/T.../B.../secret): the URL is what must stay secret.
        return f"http://{self.host}:{port}/services/T0FFLINE/B0FFLINE/0ff1ine5ecret0ff1ine5ecret"

    def misbehave(self, *answers: Misbehaviour) -> None:
        with self._lock:
            self._plan.extend(answers)

    def start(self) -> SlackReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                with receiver._lock:
                    receiver.requests += 1
                    answer = receiver._plan.pop(0) if receiver._plan else None
                if answer is not None:
                    time.sleep(answer.delay_seconds)
                    self._reply(answer.status, answer.body, answer.retry_after)
                    return
                try:
                    message = json.loads(raw)
                except ValueError:
                    self._reply(400, "invalid_payload")
                    return
                if not isinstance(message, dict) or not (message.get("text") or message.get("blocks")):
                    self._reply(400, "no_text")
                    return
                with receiver._lock:
                    receiver.messages.append(message)
                if receiver.on_message is not None:
                    receiver.on_message(message)
                self._reply(200, "ok")

            def _reply(self, status: int, body: str, retry_after: int | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                if retry_after is not None:
                    self.send_header("Retry-After", str(retry_after))
                self.end_headers()
                # The client may have given up waiting (a slow answer).
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(body.encode())

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the webhook URL is a secret: no request line is printed

        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="slack-receiver", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class TopicInbox:
    """An SQS queue subscribed to a topic: what SNS really delivered, in order."""

    def __init__(self, sns: SNSClient, sqs: SQSClient, topic_arn: str, name: str) -> None:
        self._sqs = sqs
        self._url = sqs.create_queue(QueueName=name)["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=self._url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=queue_arn)

    def receive(self, wait_seconds: int = 0) -> list[dict[str, Any]]:
        """The messages delivered since the last call (SNS's envelope: Subject, Message, ...)."""
        received = self._sqs.receive_message(
            QueueUrl=self._url, MaxNumberOfMessages=10, WaitTimeSeconds=wait_seconds
        ).get("Messages", [])
        for message in received:
            self._sqs.delete_message(QueueUrl=self._url, ReceiptHandle=message["ReceiptHandle"])
        return [json.loads(message["Body"]) for message in received]
