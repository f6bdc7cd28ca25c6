"""What the template deploys around the functions, created by the offline stack from template.yaml:
the training network, the key, the alarms, the bucket's lifecycle and access logs, and the choices
a platform engineer makes with parameters (an existing file system, existing security groups)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from retrain.local.cloudformation.stack import ACCOUNT_ID, OfflineStack, StackOptions
from retrain.local.cloudformation.template import TemplateError

QUIET = {"poll": False, "tick": False, "upload_trainer": False, "slack": False}


@pytest.fixture
def deployed() -> Iterator[OfflineStack]:
    """The template with its defaults, on moto's VPC (subnets and a private route table)."""
    with OfflineStack(StackOptions(**QUIET)) as offline:  # type: ignore[arg-type]
        yield offline


def _environment(stack: OfflineStack, logical_id: str) -> dict[str, str]:
    (spec,) = [spec for spec in stack.created.functions if spec.logical_id == logical_id]
    return spec.environment


def _self_rules(group: dict[str, Any]) -> set[tuple[str, int | None, int | None]]:
    """(protocol, from, to) of every ingress rule that admits the group itself, and only that."""
    rules = set()
    for permission in group["IpPermissions"]:
        assert permission.get("IpRanges", []) == [], "no ingress from an address range"
        peers = {pair["GroupId"] for pair in permission.get("UserIdGroupPairs", [])}
        assert peers == {group["GroupId"]}, f"ingress only from the group itself, not {peers}"
        rules.add((permission["IpProtocol"], permission.get("FromPort"), permission.get("ToPort")))
    return rules


def test_the_training_security_group_admits_lustre_and_its_own_members_only(deployed: OfflineStack) -> None:
    group_id = deployed.ref("TrainingSecurityGroup")
    (group,) = deployed.aws.ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"]

    assert group["VpcId"] == deployed.aws.ec2.describe_vpcs()["Vpcs"][-1]["VpcId"]
    rules = _self_rules(group)
    assert ("tcp", 988, 988) in rules, "Lustre's LNET port"
    assert ("tcp", 1018, 1023) in rules, "Lustre's client ports"
    assert ("-1", None, None) in rules, "all traffic among the training hosts (NCCL, gloo)"
    # The training job and the file system both get it.
    assert _environment(deployed, "TrainingJobFunction")["TRAINING_JOB_SECURITY_GROUP_IDS"] == f'["{group_id}"]'


def test_the_training_security_group_sends_only_https_to_s3_and_traffic_to_its_own_members(
    deployed: OfflineStack,
) -> None:
    group_id = deployed.ref("TrainingSecurityGroup")
    (group,) = deployed.aws.ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"]
    (s3_prefix_list,) = deployed.aws.ec2.describe_managed_prefix_lists(
        Filters=[{"Name": "prefix-list-name", "Values": ["com.amazonaws.us-east-1.s3"]}]
    )["PrefixLists"]

    egress = group["IpPermissionsEgress"]
    assert [rule for rule in egress if rule.get("IpRanges") or rule.get("Ipv6Ranges")] == [], (
        "egress to an address range (the default allow-all rule, or 0.0.0.0/0)"
    )
    rules = {
        (rule["IpProtocol"], rule.get("FromPort"), rule.get("ToPort")): (
            {item["PrefixListId"] for item in rule.get("PrefixListIds", [])},
            {pair["GroupId"] for pair in rule.get("UserIdGroupPairs", [])},
        )
        for rule in egress
    }
    assert rules == {
        ("tcp", 443, 443): ({s3_prefix_list["PrefixListId"]}, set()),
        ("-1", None, None): (set(), {group_id}),
    }


def test_a_stack_that_creates_its_security_group_without_s3s_prefix_list_is_refused() -> None:
    with pytest.raises(TemplateError, match="S3PrefixListId"):
        OfflineStack(StackOptions(parameters={"S3PrefixListId": ""}, **QUIET)).start()  # type: ignore[arg-type]


def test_only_notify_function_may_read_the_slack_webhook_says_the_secrets_policy(deployed: OfflineStack) -> None:
    secret = deployed.ref("SlackWebhookSecret")
    policy = json.loads(deployed.aws.secretsmanager.get_resource_policy(SecretId=secret)["ResourcePolicy"])

    (statement,) = policy["Statement"]
    assert (statement["Effect"], statement["Action"]) == ("Deny", "secretsmanager:GetSecretValue")
    notify_role = f"arn:aws:iam::{ACCOUNT_ID}:role/retrain-local-notify"
    assert statement["Condition"]["ArnNotEquals"]["aws:PrincipalArn"] == notify_role


def test_private_subnets_reach_s3_through_a_gateway_endpoint(deployed: OfflineStack) -> None:
    route_tables = deployed.aws.ec2.describe_route_tables()["RouteTables"]
    private = [
        table["RouteTableId"]
        for table in route_tables
        if table.get("Associations") and not table["Associations"][0].get("Main")
    ]
    (endpoint,) = deployed.aws.ec2.describe_vpc_endpoints()["VpcEndpoints"]

    assert endpoint["VpcEndpointType"] == "Gateway"
    assert endpoint["ServiceName"] == "com.amazonaws.us-east-1.s3"
    assert set(endpoint["RouteTableIds"]) == set(private)
    # Its policy names this stack's bucket (and ECR's layer bucket, read only): nothing else.
    policy = json.loads(endpoint["PolicyDocument"])
    buckets = {
        resource.removeprefix("arn:aws:s3:::").split("/", 1)[0]
        for statement in policy["Statement"]
        for resource in ([statement["Resource"]] if isinstance(statement["Resource"], str) else statement["Resource"])
    }
    assert buckets == {deployed.ref("DataBucket"), "prod-us-east-1-starport-layer-bucket"}


def test_one_customer_managed_key_encrypts_the_bucket_the_topic_and_training(deployed: OfflineStack) -> None:
    aws = deployed.aws
    key_arn = deployed.resource("DataKey").attributes["Arn"]
    key_id = key_arn.rsplit("/", 1)[1]

    assert aws.kms.describe_key(KeyId=key_id)["KeyMetadata"]["KeyManager"] == "CUSTOMER"
    assert aws.kms.get_key_rotation_status(KeyId=key_id)["KeyRotationEnabled"] is True
    encryption = aws.s3.get_bucket_encryption(Bucket=deployed.ref("DataBucket"))
    (rule,) = encryption["ServerSideEncryptionConfiguration"]["Rules"]
    assert rule["ApplyServerSideEncryptionByDefault"] == {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key_arn}
    topic = aws.sns.get_topic_attributes(TopicArn=deployed.ref("NotificationTopic"))["Attributes"]
    assert topic["KmsMasterKeyId"] == key_id
    environment = _environment(deployed, "TrainingJobFunction")
    assert environment["TRAINING_JOB_VOLUME_KMS_KEY_ID"] == key_arn
    assert environment["TRAINING_JOB_OUTPUT_KMS_KEY_ID"] == key_arn


def test_the_data_bucket_logs_access_and_expires_only_superseded_landing_and_quarantine_versions(
    deployed: OfflineStack,
) -> None:
    s3 = deployed.aws.s3
    bucket = deployed.ref("DataBucket")

    logging = s3.get_bucket_logging(Bucket=bucket)["LoggingEnabled"]
    assert logging == {"TargetBucket": deployed.ref("AccessLogsBucket"), "TargetPrefix": "data-bucket/"}
    rules = {rule["ID"]: rule for rule in s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]}
    assert set(rules) == {
        "superseded-landing-versions",
        "superseded-quarantine-versions",
        "abandoned-multipart-uploads",
    }
    for rule_id, prefix in (
        ("superseded-landing-versions", "incoming/"),
        ("superseded-quarantine-versions", "quarantine/"),
    ):
        rule = rules[rule_id]
        assert rule["Filter"]["Prefix"] == prefix if "Filter" in rule else rule["Prefix"] == prefix
        assert rule["NoncurrentVersionExpiration"]["NoncurrentDays"] == 30
        assert "Expiration" not in rule or "Days" not in rule["Expiration"], "current versions are never expired"
    assert rules["abandoned-multipart-uploads"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 7}
    # Nothing expires under dataset/: frozen manifests name those versions.
    for rule in rules.values():
        prefix = rule.get("Filter", {}).get("Prefix", rule.get("Prefix", ""))
        assert not (prefix == "" and "NoncurrentVersionExpiration" in rule)


def test_alarms_reach_the_team_through_the_topic(deployed: OfflineStack) -> None:
    topic = deployed.ref("NotificationTopic")
    alarms = {alarm["AlarmName"]: alarm for alarm in deployed.aws.cloudwatch.describe_alarms()["MetricAlarms"]}
    by_logical_id = {
        logical_id: alarms[deployed.ref(logical_id)]
        for logical_id in (
            "IntakeDeadLetterAlarm",
            "RefusedEventsAlarm",
            "FunctionErrorsAlarm",
            "FunctionThrottlesAlarm",
            "RunFailuresAlarm",
            "RunEndedFailuresAlarm",
        )
    }

    for logical_id, alarm in by_logical_id.items():
        assert alarm["AlarmActions"] == [topic], logical_id
        assert alarm.get("AlarmDescription"), f"{logical_id} says where to look"
    for alarm_id, queue in (
        ("IntakeDeadLetterAlarm", "IntakeDeadLetterQueue"),
        ("RunEndedFailuresAlarm", "RunEndedFailureQueue"),  # RunEndedFunction's on-failure destination
    ):
        dead_letters = by_logical_id[alarm_id]
        assert dead_letters["MetricName"] == "ApproximateNumberOfMessagesVisible"
        assert dead_letters["Dimensions"] == [
            {"Name": "QueueName", "Value": deployed.resource(queue).attributes["QueueName"]}
        ]
    # Errors and throttles of every function, summed: one alarm each, not eight. Not the trigger's
    # throttles: its nudges take turns by design (tests/integration/test_trigger_nudges.py).
    everyone = {spec.name for spec in deployed.created.functions}
    for logical_id, metric, watched in (
        ("FunctionErrorsAlarm", "Errors", everyone),
        ("FunctionThrottlesAlarm", "Throttles", everyone - {deployed.ref("TriggerFunction")}),
    ):
        queries = by_logical_id[logical_id]["Metrics"]
        by_id = {
            query["Id"]: query["MetricStat"]["Metric"]["Dimensions"][0]["Value"]
            for query in queries
            if "MetricStat" in query and query["MetricStat"]["Metric"]["MetricName"] == metric
        }
        assert set(by_id.values()) == watched, logical_id
        # The alarm judges only what its expression adds up: a query left out of the SUM watches nothing.
        (total,) = [query for query in queries if query.get("ReturnData")]
        summed = set(re.findall(r"\w+", total["Expression"].removeprefix("SUM")))
        assert {by_id[query_id] for query_id in summed & set(by_id)} == watched, f"{logical_id}'s SUM"
        assert summed <= set(by_id), f"{logical_id}'s SUM names a query that does not exist"


def test_the_ledger_survives_one_delete_call(deployed: OfflineStack) -> None:
    """Deletion protection refuses DeleteTable (moto enforces it as DynamoDB does), and point-in-time
    recovery is on: one call cannot lose every file's fate, batch and trust decision."""
    dynamodb = deployed.aws.dynamodb
    ledger = deployed.ref("LedgerTable")

    assert dynamodb.describe_table(TableName=ledger)["Table"]["DeletionProtectionEnabled"] is True
    with pytest.raises(ClientError, match="DeletionProtectionEnabled is set to True"):
        dynamodb.delete_table(TableName=ledger)
    backups = dynamodb.describe_continuous_backups(TableName=ledger)["ContinuousBackupsDescription"]
    assert backups["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"] == "ENABLED"
    assert "LedgerBackupVault" not in deployed.created.resources, "no backup plan unless the deployer asks"


def test_a_change_to_the_data_key_is_told_on_a_topic_that_does_not_need_the_key(deployed: OfflineStack) -> None:
    events, sns = deployed.aws.events, deployed.aws.sns
    key = deployed.resource("DataKey")
    topic = deployed.ref("KeyAlarmTopic")
    rule = events.describe_rule(Name=deployed.ref("KeyChangesRule"))

    pattern = json.loads(rule["EventPattern"])
    assert pattern["detail"]["requestParameters"]["keyId"] == [key.attributes["Arn"], key.ref]
    (target,) = events.list_targets_by_rule(Rule=rule["Name"])["Targets"]
    assert target["Arn"] == topic
    assert "cancel-key-deletion" in target["InputTransformer"]["InputTemplate"]
    attributes = sns.get_topic_attributes(TopicArn=topic)["Attributes"]
    assert "KmsMasterKeyId" not in attributes, "a topic under DataKey goes silent when the key is disabled"
    (statement,) = json.loads(attributes["Policy"])["Statement"]
    assert statement["Principal"] == {"Service": "events.amazonaws.com"}
    assert statement["Condition"]["ArnEquals"]["aws:SourceArn"] == rule["Arn"]
    assert deployed.created.outputs["KeyAlarmTopicArn"] == topic


def test_a_stack_asked_to_back_up_the_ledger_still_starts_offline() -> None:
    with OfflineStack(StackOptions(parameters={"LedgerBackupRetentionDays": "35"}, **QUIET)) as offline:  # type: ignore[arg-type]
        # AWS Backup runs no job offline: its resources are left out, the rest of the stack is made.
        assert not {"LedgerBackupVault", "LedgerBackupPlan", "LedgerBackupSelection"} & set(offline.created.resources)
        assert "BackupRole" in offline.created.resources
        assert "LedgerTable" in offline.created.resources


def test_the_state_machine_logs_every_event_without_execution_data(deployed: OfflineStack) -> None:
    machine = deployed.aws.stepfunctions.describe_state_machine(stateMachineArn=deployed.ref("RetrainStateMachine"))
    logging = machine["loggingConfiguration"]

    assert logging["level"] == "ALL"
    assert logging["includeExecutionData"] is False
    (destination,) = logging["destinations"]
    assert deployed.ref("RetrainStateMachineLogGroup") in destination["cloudWatchLogsLogGroup"]["logGroupArn"]


def test_the_intake_mapping_stops_polling_at_the_reserved_concurrency(deployed: OfflineStack) -> None:
    (mapping,) = [
        m for m in deployed.created.mappings if m.queue_arn == deployed.resource("IntakeQueue").attributes["Arn"]
    ]
    assert mapping.maximum_concurrency == 20


def test_an_existing_file_system_and_security_groups_are_used_instead_of_new_ones() -> None:
    parameters = {
        "ExistingFileSystemId": "fs-0123456789abcdef0",
        "ExistingFileSystemMountName": "abcdefgh",
        "ExistingFileSystemDirectory": "annotations",
        "TrainingSecurityGroupIds": "sg-0aaa1111bbbb2222c,sg-0ddd3333eeee4444f",
        "PrivateRouteTableIds": "",
    }
    with OfflineStack(StackOptions(parameters=parameters, **QUIET)) as offline:  # type: ignore[arg-type]
        created = offline.created.resources
        environment = _environment(offline, "TrainingJobFunction")

        for absent in (
            "DatasetFileSystem",
            "DatasetRepositoryAssociation",
            "TrainingSecurityGroup",
            "S3GatewayEndpoint",
        ):
            assert absent not in created
        assert offline.aws.fsx.describe_file_systems()["FileSystems"] == []
        assert offline.aws.ec2.describe_vpc_endpoints()["VpcEndpoints"] == []
        assert environment["TRAINING_JOB_FSX_FILE_SYSTEM_ID"] == "fs-0123456789abcdef0"
        assert environment["TRAINING_JOB_FSX_MOUNT_NAME"] == "abcdefgh"
        assert environment["TRAINING_JOB_FSX_DIRECTORY"] == "annotations"
        assert environment["TRAINING_JOB_SECURITY_GROUP_IDS"] == '["sg-0aaa1111bbbb2222c","sg-0ddd3333eeee4444f"]'
        assert offline.created.outputs["DatasetFileSystemId"] == "fs-0123456789abcdef0"


def test_a_stack_that_reads_the_dataset_from_s3_has_no_file_system_and_says_where_to_read() -> None:
    with OfflineStack(StackOptions(parameters={"DatasetSource": "s3"}, **QUIET)) as offline:  # type: ignore[arg-type]
        training = _environment(offline, "TrainingJobFunction")
        sync = _environment(offline, "DatasetSyncFunction")

        assert offline.aws.fsx.describe_file_systems()["FileSystems"] == []
        assert "DatasetFileSystem" not in offline.created.resources
        assert "DatasetFileSystemId" not in offline.created.outputs
        assert training["TRAINING_JOB_DATASET_SOURCE"] == "s3"
        assert training["TRAINING_JOB_DATASET_S3_URI"] == f"s3://{offline.ref('DataBucket')}/dataset/"
        assert not {"TRAINING_JOB_FSX_FILE_SYSTEM_ID", "TRAINING_JOB_FSX_MOUNT_NAME"} & set(training)
        assert "FILE_SYSTEM_ID" not in sync, "the sync step has nothing to import"


def test_an_s3_dataset_with_an_existing_file_system_is_refused_as_contradictory() -> None:
    parameters = {
        "DatasetSource": "s3",
        "ExistingFileSystemId": "fs-0123456789abcdef0",
        "ExistingFileSystemMountName": "abc",
    }
    with pytest.raises(TemplateError, match="DatasetSource s3 reads the dataset from S3"):
        OfflineStack(StackOptions(parameters=parameters, **QUIET)).start()  # type: ignore[arg-type]


def test_an_existing_file_system_without_its_mount_name_is_refused_as_cloudformation_refuses_it() -> None:
    with pytest.raises(TemplateError, match="ExistingFileSystemId needs ExistingFileSystemMountName"):
        OfflineStack(StackOptions(parameters={"ExistingFileSystemId": "fs-0123456789abcdef0"}, **QUIET)).start()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"IntakeMaxConcurrency": "1"}, "IntakeMaxConcurrency: 1 is below its MinValue 2"),
        ({"ExistingFileSystemId": "fsx-12"}, "ExistingFileSystemId: 'fsx-12' does not match"),
        ({"FunctionTimeoutSeconds": "soon"}, "FunctionTimeoutSeconds: 'soon' is not a number"),
    ],
)
def test_a_parameter_value_cloudformation_refuses_stops_the_offline_stack(
    parameters: dict[str, str], message: str
) -> None:
    with pytest.raises(TemplateError, match=message):
        OfflineStack(StackOptions(parameters=parameters, **QUIET)).start()  # type: ignore[arg-type]
