"""Fixtures several unit test files share."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws

from functions.data.ledger import Ledger
from retrain.local.cloudformation.stack import create_ledger_table


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    """The ledger on moto's DynamoDB, in process, with the template's table (keys and indexes)."""
    with mock_aws():
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        create_ledger_table(dynamodb, "ledger")
        yield Ledger(dynamodb, "ledger")
