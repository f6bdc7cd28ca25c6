"""Fixtures several unit test files share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from functions.data.ledger import Ledger


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    """The ledger on moto's DynamoDB, in process, with the template's table (keys and indexes)."""
    # Imported here, not at the top: the SDK-parity and image-torch environments load this file
    # too (their tests live under tests/unit) and have neither moto nor the local stack.
    import boto3  # noqa: PLC0415
    from moto import mock_aws  # noqa: PLC0415

    from functions.data.ledger import Ledger  # noqa: PLC0415
    from retrain.local.cloudformation.stack import create_ledger_table  # noqa: PLC0415

    with mock_aws():
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        create_ledger_table(dynamodb, "ledger")
        yield Ledger(dynamodb, "ledger")
