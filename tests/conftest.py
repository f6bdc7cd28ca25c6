"""Shared test set-up: offline AWS, real-shaped events, and no sockets beyond loopback."""

from __future__ import annotations

import ipaddress
import json
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

EVENTS = Path(__file__).parent / "events"

# A shell that starts the suite as a background job without job control (`nohup ... &`, `&` in a
# script) has it ignore SIGINT, and every process it starts inherits that: the tests that press
# Ctrl-C on `retrain local up` would wait for a stop that never comes, and leave it running.
# Python's own handler is not inherited across exec, so children start with Ctrl-C working.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Where moto departs from AWS, the offline stack fixes it (retrain/local/endpoint/moto_fixes.py):
# tests that use moto directly get the same fixes, whatever ran first in their process. The SDK
# parity environment has no moto, and needs none.
try:
    from retrain.local.endpoint import moto_fixes
except ImportError:
    pass
else:
    moto_fixes.apply()


def load_event(name: str) -> dict[str, Any]:
    """A real-shaped AWS event from tests/events/."""
    event: dict[str, Any] = json.loads((EVENTS / name).read_text(encoding="utf-8"))
    return event


@pytest.fixture(autouse=True)
def _offline_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials and a region, so nothing can reach a real account by accident."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    for name in ("RETRAIN_STACK", "DATA_BUCKET", "LEDGER_TABLE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _own_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Where `retrain local up` records itself: per test, never the stack a person has running."""
    monkeypatch.setenv("RETRAIN_STATE_DIR", str(tmp_path_factory.mktemp("state")))


_real_connect = socket.socket.connect


def _loopback_only(self: socket.socket, address: Any) -> Any:
    if self.family in (socket.AF_INET, socket.AF_INET6):
        host = address[0]
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ConnectionRefusedError(f"tests may only connect to loopback, not {host!r}")
    return _real_connect(self, address)


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(socket.socket, "connect", _loopback_only)
    yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every slow test says how long it takes (`@pytest.mark.slow(seconds=N)`): `make test-quick`
    leaves them out, and whoever runs them (`make test` does) should know the cost."""
    unstated = sorted(
        {
            item.nodeid.split("[")[0]
            for item in items
            for mark in item.iter_markers("slow")
            if not isinstance(mark.kwargs.get("seconds"), int)
        }
    )
    if unstated:
        raise pytest.UsageError(
            "slow tests must state their duration here, @pytest.mark.slow(seconds=N): " + ", ".join(unstated)
        )
