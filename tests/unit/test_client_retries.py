"""A throttled call is tried exactly MAX_ATTEMPTS times in all, against a real (loopback) HTTP server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from botocore.exceptions import ClientError

from functions.common import clients

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
)


class AlwaysSlowDown(BaseHTTPRequestHandler):
    requests = 0

    def do_GET(self) -> None:
        type(self).requests += 1
        self.send_response(503)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(SLOW_DOWN)))
        self.end_headers()
        self.wfile.write(SLOW_DOWN)

    def log_message(self, format: str, *args: object) -> None:
        del format, args


@pytest.fixture
def s3_that_always_slows_down() -> Iterator[str]:
    AlwaysSlowDown.requests = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), AlwaysSlowDown)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_throttled_call_is_tried_max_attempts_times_in_all(
    s3_that_always_slows_down: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No real backoff: what is counted is the attempts, not the waiting.
    monkeypatch.setattr("botocore.retries.standard.ExponentialBackoff.delay_amount", lambda self, context: 0)
    s3 = clients.make("s3", endpoint_url=s3_that_always_slows_down, credentials=("testing", "testing"))

    with pytest.raises(ClientError) as raised:
        s3.get_object(Bucket="bucket", Key="key")

    assert raised.value.response["Error"]["Code"] == "SlowDown"
    assert AlwaysSlowDown.requests == clients.MAX_ATTEMPTS == 8
