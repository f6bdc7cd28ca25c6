"""Which state of a run failed, read from its execution's history.

Every Catch of the state machine sends the run to the same failure branch with its error in
`$.error` and nothing else: the failed state is the last one entered before the branch began
(a retried Task is entered once; Choice, Wait and Pass states cannot fail into a Catch). The
branch's "Tell the team the run failed" runs while the execution is still RUNNING, so its history
already holds that entry. `retrain runs cancel` and RunEndedFunction name the state themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

if TYPE_CHECKING:
    from mypy_boto3_stepfunctions import SFNClient

# statemachine/retrain.asl.yaml's failure branch, in order (tests/unit/test_template.py checks it).
FAILURE_BRANCH = (
    "Stop the training job if one was created",
    "Release the lock after the failure",
    "Tell the team the run failed",
    "Run failed",
)


def failed_state(sfn: SFNClient, execution_arn: str) -> str | None:
    """The state whose failure sent the run down the failure branch; None when the history does
    not say (no branch entered yet) or cannot be read: the message goes out all the same."""
    last = None
    try:
        # Forward, page by page: moto's engine ignores reverseOrder. A run's history is short (the
        # job is not polled; the FSx import and Debugger's rules are, about 1,000 looks at most).
        for page in sfn.get_paginator("get_execution_history").paginate(
            executionArn=execution_arn, includeExecutionData=False
        ):
            for event in page["events"]:
                entered = event.get("stateEnteredEventDetails")
                if entered is None:
                    continue
                if entered["name"] in FAILURE_BRANCH:
                    return last
                last = entered["name"]
    except (ClientError, BotoCoreError):
        return None  # the team is told the run failed, at an "unknown" state, rather than not at all
    return None
