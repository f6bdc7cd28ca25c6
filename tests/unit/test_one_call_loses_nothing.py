"""No single call loses everything: the ledger refuses DeleteTable and can be restored, AWS
Backup copies it when the deployer asks, and a call that makes DataKey (and so every object of
the bucket) unusable reaches the team within minutes, with what to run to undo it.

The template is resolved as deployed (tests/iam.py's fake resolver); the key's alarm is played
on moto's EventBridge with the template's own pattern and message, fed a real-shaped CloudTrail
event (tests/events/cloudtrail/).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from tests import iam
from tests.conftest import load_event

ADMIN = f"arn:aws:iam::{iam.ACCOUNT}:role/Administrator"
BACKUP_RESOURCES = {"LedgerBackupVault", "LedgerBackupPlan", "LedgerBackupSelection", "BackupRole"}
OTHER_KEY = f"arn:aws:kms:{iam.REGION}:{iam.ACCOUNT}:key/0badc0de-0000-4000-8000-000000000000"


@pytest.fixture(scope="module")
def body() -> dict[str, Any]:
    return iam.template().body


def properties(body: dict[str, Any], logical_id: str, **parameters: str) -> Any:
    return iam.fake_resolver(body, **parameters).resolve(copy.deepcopy(body["Resources"][logical_id]["Properties"]))


def resolve(body: dict[str, Any], node: Any) -> Any:
    return iam.fake_resolver(body).resolve(node)


# ------------------------------------------------------------------ ledger --
def test_the_ledger_refuses_deletion_and_keeps_its_point_in_time_recovery(body: dict[str, Any]) -> None:
    ledger = body["Resources"]["LedgerTable"]
    props = properties(body, "LedgerTable")

    assert props["DeletionProtectionEnabled"] is True, "one DeleteTable would lose every file's fate"
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    # Deleting the stack keeps the table (Retain calls no DeleteTable), so protection blocks no teardown.
    assert ledger["DeletionPolicy"] == ledger["UpdateReplacePolicy"] == "Retain"


def test_backups_are_made_only_when_the_deployer_asks(body: dict[str, Any]) -> None:
    conditional = {logical_id for logical_id, r in body["Resources"].items() if r.get("Condition") == "BackUpTheLedger"}
    assert conditional == BACKUP_RESOURCES
    assert body["Outputs"]["LedgerBackupVaultName"]["Condition"] == "BackUpTheLedger"
    assert not iam.fake_resolver(body).condition("BackUpTheLedger"), "the default makes no plan"
    assert iam.fake_resolver(body, LedgerBackupRetentionDays="35").condition("BackUpTheLedger")


def test_the_plan_copies_the_ledger_daily_into_a_vault_that_outlives_the_key(body: dict[str, Any]) -> None:
    asked = {"LedgerBackupRetentionDays": "35"}
    (rule,) = properties(body, "LedgerBackupPlan", **asked)["BackupPlan"]["BackupPlanRule"]
    selection = properties(body, "LedgerBackupSelection", **asked)["BackupSelection"]
    vault = properties(body, "LedgerBackupVault", **asked)
    role = properties(body, "BackupRole", **asked)

    assert rule["ScheduleExpression"] == "cron(0 3 * * ? *)"
    assert rule["Lifecycle"] == {"DeleteAfterDays": "35"}  # a parameter: CloudFormation passes it on
    assert rule["TargetBackupVault"] == resolve(body, {"Ref": "LedgerBackupVault"})
    assert selection["Resources"] == [resolve(body, {"Fn::GetAtt": ["LedgerTable", "Arn"]})]
    assert selection["IamRoleArn"] == resolve(body, {"Fn::GetAtt": ["BackupRole", "Arn"]})
    # Under DataKey the copies would be lost with the key (AWS Backup's own key instead).
    assert "EncryptionKeyArn" not in vault
    assert body["Resources"]["LedgerBackupVault"]["DeletionPolicy"] == "Retain"
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "backup.amazonaws.com"}


def test_no_one_deletes_a_copy_or_shortens_its_life(body: dict[str, Any]) -> None:
    policy = iam.resource_policy(properties(body, "LedgerBackupVault", LedgerBackupRetentionDays="35")["AccessPolicy"])
    copy_arn = f"arn:aws:backup:{iam.REGION}:{iam.ACCOUNT}:recovery-point:0f6b3f8e-2f8c-4a7e-9a61-5d1c7a3e2b90"

    for action in ("backup:DeleteRecoveryPoint", "backup:UpdateRecoveryPointLifecycle"):
        assert iam.denied_by(policy, ADMIN, iam.Need(action, copy_arn)), f"an administrator may {action}"
    assert not iam.denied_by(policy, ADMIN, iam.Need("backup:StartRestoreJob", copy_arn)), "a copy can be restored"


# --------------------------------------------------------------------- key --
def key_policy(body: dict[str, Any]) -> list[iam.ResourceStatement]:
    return iam.resource_policy(properties(body, "DataKey")["KeyPolicy"])


def key_arn(body: dict[str, Any]) -> str:
    return str(resolve(body, {"Fn::GetAtt": ["DataKey", "Arn"]}))


@pytest.mark.parametrize(("days", "allowed"), [("7", False), ("29", False), ("30", True), (None, True)])
def test_a_deletion_of_the_key_waits_the_longest_window_kms_allows(
    body: dict[str, Any], days: str | None, allowed: bool
) -> None:
    """Without PendingWindowInDays KMS waits 30 days: only a shorter wait asked for is refused."""
    window = {"kms:ScheduleKeyDeletionPendingWindowInDays": days} if days else {}
    schedule = iam.Need("kms:ScheduleKeyDeletion", key_arn(body), window)

    assert iam.allowed_by(key_policy(body), ADMIN, schedule) is allowed


def rule_properties(body: dict[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = properties(body, "KeyChangesRule")
    return props


def cloudtrail(call: str, key: str) -> dict[str, Any]:
    """The real-shaped ScheduleKeyDeletion event, as `call` on `key` (its id or ARN, as the caller named it)."""
    event = load_event("cloudtrail/kms_schedule_key_deletion.json")
    arn = key if key.startswith("arn:") else f"arn:aws:kms:{iam.REGION}:{iam.ACCOUNT}:key/{key}"
    event["detail"]["eventName"] = call
    event["detail"]["requestParameters"]["keyId"] = key
    event["detail"]["resources"][0]["ARN"] = arn
    event["detail"]["responseElements"]["keyId"] = arn
    return event


@pytest.fixture
def alarm_inbox(body: dict[str, Any]) -> Iterator[tuple[Any, str]]:
    """moto's EventBridge with the template's rule (pattern and message), delivering to a queue
    where the topic would be: (events client, queue URL)."""
    props = rule_properties(body)
    (target,) = props["Targets"]
    with mock_aws():
        events, sqs = boto3.client("events"), boto3.client("sqs")
        queue = sqs.create_queue(QueueName="key-alarm-inbox")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        events.put_rule(Name="key-changes", EventPattern=json.dumps(props["EventPattern"]), State=props["State"])
        events.put_targets(
            Rule="key-changes",
            Targets=[{"Id": target["Id"], "Arn": queue_arn, "InputTransformer": target["InputTransformer"]}],
        )
        yield events, queue


def send(events: Any, event: dict[str, Any]) -> None:
    answer = events.put_events(
        Entries=[{"Source": event["source"], "DetailType": event["detail-type"], "Detail": json.dumps(event["detail"])}]
    )
    assert answer["FailedEntryCount"] == 0


def received(queue: str) -> list[dict[str, Any]]:
    messages = boto3.client("sqs").receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages", [])
    return [json.loads(message["Body"]) for message in messages]


@pytest.mark.parametrize("named_by", ["ARN", "id"])
def test_a_scheduled_deletion_of_the_data_key_tells_who_did_it_and_how_to_cancel_it(
    body: dict[str, Any], alarm_inbox: tuple[Any, str], named_by: str
) -> None:
    events, queue = alarm_inbox
    key = key_arn(body) if named_by == "ARN" else str(resolve(body, {"Ref": "DataKey"}))

    send(events, cloudtrail("ScheduleKeyDeletion", key))

    (message,) = received(queue)
    assert message["alarm"].startswith(f"ScheduleKeyDeletion on the data key of stack {iam.STACK}")
    assert message["by"] == "arn:aws:sts::111122223333:assumed-role/Administrator/alice"
    assert message["at"] == "2026-03-02T09:14:07Z"
    assert message["from"] == "203.0.113.24"
    assert f"aws kms cancel-key-deletion --key-id {key_arn(body)}" in message["if it was not meant"]
    assert f"aws kms enable-key --key-id {key_arn(body)}" in message["if it was not meant"]


@pytest.mark.parametrize("call", ["DisableKey", "PutKeyPolicy"])
def test_disabling_the_key_or_rewriting_its_policy_is_told_too(
    body: dict[str, Any], alarm_inbox: tuple[Any, str], call: str
) -> None:
    events, queue = alarm_inbox

    send(events, cloudtrail(call, key_arn(body)))

    (message,) = received(queue)
    assert message["alarm"].startswith(f"{call} on the data key")


@pytest.mark.parametrize(
    ("call", "key"),
    [
        ("ScheduleKeyDeletion", OTHER_KEY),  # another key of the account
        ("EnableKeyRotation", None),  # a call that harms nothing
        ("Decrypt", None),  # the stack's daily use
    ],
)
def test_other_keys_and_harmless_calls_stay_quiet(
    body: dict[str, Any], alarm_inbox: tuple[Any, str], call: str, key: str | None
) -> None:
    events, queue = alarm_inbox

    send(events, cloudtrail(call, key or key_arn(body)))

    assert received(queue) == []


def test_only_the_keys_rule_publishes_to_a_topic_that_works_without_the_key(body: dict[str, Any]) -> None:
    assert "KmsMasterKeyId" not in properties(body, "KeyAlarmTopic"), (
        "a topic under DataKey cannot be published to once the key is disabled or pending deletion"
    )
    policy_props = properties(body, "KeyAlarmTopicPolicy")
    topic = resolve(body, {"Ref": "KeyAlarmTopic"})
    assert policy_props["Topics"] == [topic]
    (target,) = rule_properties(body)["Targets"]
    assert target["Arn"] == topic
    policy = iam.resource_policy(policy_props["PolicyDocument"])
    rule = str(resolve(body, {"Fn::GetAtt": ["KeyChangesRule", "Arn"]}))
    publish = iam.Need("sns:Publish", topic, {"aws:SourceArn": rule})

    assert iam.allowed_by(policy, "events.amazonaws.com", publish)
    another_rule = iam.Need("sns:Publish", topic, {"aws:SourceArn": f"{rule}-of-someone-else"})
    assert not iam.allowed_by(policy, "events.amazonaws.com", another_rule)
