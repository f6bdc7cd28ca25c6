"""Asking the trigger to look now, when batches close, instead of at its next scheduled look."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from functions.common.requests import TriggerInput

if TYPE_CHECKING:
    from mypy_boto3_lambda import LambdaClient


@dataclass(frozen=True)
class TriggerKick:
    lambda_client: LambdaClient
    function_name: str  # empty: no kick, the trigger looks on its schedule

    def __call__(self, reason: str) -> None:
        """Run the trigger soon, without waiting for it (it decides whether anything starts)."""
        if not self.function_name:
            return
        self.lambda_client.invoke(
            FunctionName=self.function_name,
            InvocationType="Event",
            Payload=TriggerInput(source=reason, time=datetime.now(UTC)).model_dump_json(exclude_defaults=True).encode(),
        )
