"""Create what `template.yaml` declares, with boto3, in dependency order.

One method per resource type; each returns what the resource answers to `Ref` and `Fn::GetAtt`,
so later resources resolve against it. Functions and their event sources are not created in moto
(it would need Docker to run them): they go to the in-process runtime, the SQS poller, the
ticker and the event bus instead. A type this file does not know stops the stack with its name.
"""

from __future__ import annotations

import json
import logging
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from retrain.local.cloudformation.template import Created, Resolver, Template, TemplateError
from retrain.local.events.eventbridge import DEFAULT_BUS, EventBusError, EventRule, compile_pattern
from retrain.local.lambda_runtime.contract import FunctionSpec
from retrain.local.lambda_runtime.poller import EventSourceMapping
from retrain.local.lambda_runtime.ticker import Schedule

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import CreateTableInputTypeDef

    from retrain.local.endpoint.clients import StackClients

log = logging.getLogger(__name__)

# IAM is not enforced offline: policies are left out (a role or managed policy still answers
# Ref and GetAtt). The Rules section is checked, not created.
IGNORED_TYPES = frozenset({"AWS::IAM::Policy"})
# What the offline stack leaves out, and why (a stack with LedgerBackupRetentionDays > 0 still
# starts): moto's AWS Backup has no selections and runs no jobs, so a plan would copy nothing.
NOT_MADE_OFFLINE = {
    "AWS::Backup::BackupVault": "AWS Backup runs no job offline",
    "AWS::Backup::BackupPlan": "AWS Backup runs no job offline",
    "AWS::Backup::BackupSelection": "AWS Backup runs no job offline",
}
PLACEHOLDER = "${"


@dataclass
class CreatedStack:
    """Everything the offline stack made from the template."""

    resources: dict[str, Created] = field(default_factory=dict)
    functions: list[FunctionSpec] = field(default_factory=list)
    mappings: list[EventSourceMapping] = field(default_factory=list)
    schedules: list[Schedule] = field(default_factory=list)
    rules: list[EventRule] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)
    # The parameter values it was made with (what a resource's policy resolves against).
    parameters: dict[str, str] = field(default_factory=dict)


class ResourceBuilder:
    def __init__(self, template: Template, resolver: Resolver, aws: StackClients) -> None:
        self._template = template
        self._resolver = resolver
        self._aws = aws
        self._stack = CreatedStack()
        self._creators: dict[str, Callable[[str, dict[str, Any]], Created | None]] = {
            "AWS::S3::Bucket": self._bucket,
            "AWS::S3::BucketPolicy": self._bucket_policy,
            "AWS::SQS::Queue": self._queue,
            "AWS::SQS::QueuePolicy": self._queue_policy,
            "AWS::DynamoDB::Table": self._table,
            "AWS::SNS::Topic": self._topic,
            "AWS::SNS::Subscription": self._subscription,
            "AWS::SNS::TopicPolicy": self._topic_policy,
            "AWS::Events::Rule": self._events_rule,
            "AWS::SecretsManager::Secret": self._secret,
            "AWS::SecretsManager::ResourcePolicy": self._secret_resource_policy,
            "AWS::Logs::LogGroup": self._log_group,
            "AWS::Serverless::Function": self._function,
            "AWS::Serverless::StateMachine": self._state_machine,
            "AWS::IAM::Role": self._role,
            "AWS::FSx::FileSystem": self._file_system,
            "AWS::FSx::DataRepositoryAssociation": self._repository_association,
            "AWS::SageMaker::ModelPackageGroup": self._model_package_group,
            "AWS::IAM::ManagedPolicy": self._managed_policy,
            "AWS::KMS::Key": self._kms_key,
            "AWS::KMS::Alias": self._kms_alias,
            "AWS::EC2::SecurityGroup": self._security_group,
            "AWS::EC2::SecurityGroupIngress": self._security_group_ingress,
            "AWS::EC2::SecurityGroupEgress": self._security_group_egress,
            "AWS::EC2::VPCEndpoint": self._vpc_endpoint,
            "AWS::CloudWatch::Alarm": self._alarm,
        }

    def build(self) -> CreatedStack:
        self._resolver.check_rules(self._template.rules)
        self._stack.parameters = dict(self._resolver.parameters)
        for logical_id in self._template.creation_order():
            resource = self._template.resources[logical_id]
            resource_type = resource.get("Type", "")
            if resource_type in IGNORED_TYPES:
                continue
            if "Condition" in resource and not self._resolver.condition(resource["Condition"]):
                log.info("%s: not created (condition %s is false)", logical_id, resource["Condition"])
                continue
            if resource_type in NOT_MADE_OFFLINE:
                # Not made, but answering Ref and GetAtt as AWS would, for the resources naming it.
                log.info("%s: not made offline (%s)", logical_id, NOT_MADE_OFFLINE[resource_type])
                self._resolver.created[logical_id] = self._not_made(logical_id, resource.get("Properties", {}))
                continue
            creator = self._creators.get(resource_type)
            if creator is None:
                raise TemplateError(f"{logical_id} is a {resource_type}, which the offline stack cannot create")
            properties = self._resolver.resolve(resource.get("Properties", {}))
            created = creator(logical_id, properties)
            if created is not None:
                self._resolver.created[logical_id] = created
                self._stack.resources[logical_id] = created
        for name, output in self._template.body.get("Outputs", {}).items():
            if "Condition" in output and not self._resolver.condition(output["Condition"]):
                continue
            self._stack.outputs[name] = str(self._resolver.resolve(output["Value"]))
        return self._stack

    def _not_made(self, logical_id: str, props: dict[str, Any]) -> Created:
        name = str(self._resolver.resolve(props.get("BackupVaultName", ""))) or self._name(logical_id)
        arn = self._arn("backup", f"backup-vault:{name}")
        return Created(ref=name, attributes={"BackupVaultName": name, "BackupVaultArn": arn})

    def _name(self, logical_id: str) -> str:
        return f"{self._resolver.stack_name}-{logical_id}"

    def _arn(self, service: str, resource: str) -> str:
        r = self._resolver
        return f"arn:aws:{service}:{r.region}:{r.account_id}:{resource}"

    # ------------------------------------------------------------------ S3 --
    def _bucket(self, logical_id: str, props: dict[str, Any]) -> Created:
        s3 = self._aws.s3
        name = props.get("BucketName") or self._name(logical_id).lower()
        if self._resolver.region == "us-east-1":
            s3.create_bucket(Bucket=name)
        else:
            s3.create_bucket(
                Bucket=name,
                CreateBucketConfiguration={"LocationConstraint": self._resolver.region},  # type: ignore[typeddict-item]
            )
        if "VersioningConfiguration" in props:
            s3.put_bucket_versioning(
                Bucket=name,
                VersioningConfiguration={"Status": props["VersioningConfiguration"]["Status"]},
            )
        if "BucketEncryption" in props:
            encryption: list[Any] = [
                _encryption_rule(rule) for rule in props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
            ]
            s3.put_bucket_encryption(Bucket=name, ServerSideEncryptionConfiguration={"Rules": encryption})
        if "PublicAccessBlockConfiguration" in props:
            s3.put_public_access_block(
                Bucket=name,
                PublicAccessBlockConfiguration=props["PublicAccessBlockConfiguration"],
            )
        if "OwnershipControls" in props:
            s3.put_bucket_ownership_controls(Bucket=name, OwnershipControls=props["OwnershipControls"])
        if "LifecycleConfiguration" in props:
            rules: list[Any] = [_lifecycle_rule(r) for r in props["LifecycleConfiguration"]["Rules"]]
            s3.put_bucket_lifecycle_configuration(Bucket=name, LifecycleConfiguration={"Rules": rules})
        if "LoggingConfiguration" in props:
            logging_config = props["LoggingConfiguration"]
            s3.put_bucket_logging(
                Bucket=name,
                BucketLoggingStatus={
                    "LoggingEnabled": {
                        "TargetBucket": logging_config["DestinationBucketName"],
                        "TargetPrefix": logging_config.get("LogFilePrefix", ""),
                    }
                },
            )
        queues = props.get("NotificationConfiguration", {}).get("QueueConfigurations", [])
        if queues:
            s3.put_bucket_notification_configuration(
                Bucket=name,
                NotificationConfiguration={
                    "QueueConfigurations": [_queue_notification(q) for q in queues]  # type: ignore[misc]
                },
            )
        return Created(ref=name, attributes={"Arn": f"arn:aws:s3:::{name}", "DomainName": name})

    def _bucket_policy(self, logical_id: str, props: dict[str, Any]) -> None:
        document = dict(props["PolicyDocument"])
        # moto enforces bucket policies but ignores their conditions, so a conditional Deny
        # (such as "deny unless TLS") would deny everything offline: leave those out here.
        kept = [s for s in document["Statement"] if not (s["Effect"] == "Deny" and "Condition" in s)]
        if len(kept) < len(document["Statement"]):
            log.info("%s: conditional Deny statements left out offline", logical_id)
        if kept:
            document["Statement"] = kept
            self._aws.s3.put_bucket_policy(Bucket=props["Bucket"], Policy=json.dumps(document))

    # ----------------------------------------------------------------- SQS --
    def _queue(self, logical_id: str, props: dict[str, Any]) -> Created:
        attributes: dict[str, str] = {}
        for name in ("VisibilityTimeout", "MessageRetentionPeriod", "DelaySeconds"):
            if name in props:
                attributes[name] = str(props[name])
        if "SqsManagedSseEnabled" in props:
            attributes["SqsManagedSseEnabled"] = str(props["SqsManagedSseEnabled"]).lower()
        if "RedrivePolicy" in props:
            attributes["RedrivePolicy"] = json.dumps(props["RedrivePolicy"])
        name = props.get("QueueName") or self._name(logical_id)
        url = self._aws.sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]  # type: ignore[arg-type]
        arn = self._arn("sqs", name)
        return Created(ref=url, attributes={"Arn": arn, "QueueName": name, "QueueUrl": url})

    def _queue_policy(self, logical_id: str, props: dict[str, Any]) -> None:
        for url in props["Queues"]:
            self._aws.sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": json.dumps(props["PolicyDocument"])})

    # ------------------------------------------------------------ DynamoDB --
    def _table(self, logical_id: str, props: dict[str, Any]) -> Created:
        name = props.get("TableName") or self._name(logical_id)
        request: CreateTableInputTypeDef = {
            "TableName": name,
            "AttributeDefinitions": props["AttributeDefinitions"],
            "KeySchema": props["KeySchema"],
            "BillingMode": props.get("BillingMode", "PROVISIONED"),
        }
        if "GlobalSecondaryIndexes" in props:
            request["GlobalSecondaryIndexes"] = props["GlobalSecondaryIndexes"]
        if "ProvisionedThroughput" in props:
            request["ProvisionedThroughput"] = props["ProvisionedThroughput"]
        if "SSESpecification" in props:
            request["SSESpecification"] = {"Enabled": props["SSESpecification"]["SSEEnabled"]}
        if "DeletionProtectionEnabled" in props:
            request["DeletionProtectionEnabled"] = str(props["DeletionProtectionEnabled"]).lower() == "true"
        dynamodb = self._aws.dynamodb
        table = dynamodb.create_table(**request)["TableDescription"]
        recovery = props.get("PointInTimeRecoverySpecification", {}).get("PointInTimeRecoveryEnabled")
        if recovery is not None:
            dynamodb.update_continuous_backups(
                TableName=name,
                PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": str(recovery).lower() == "true"},
            )
        ttl = props.get("TimeToLiveSpecification")
        if ttl:
            dynamodb.update_time_to_live(
                TableName=name,
                TimeToLiveSpecification={
                    "Enabled": ttl["Enabled"],
                    "AttributeName": ttl["AttributeName"],
                },
            )
        return Created(ref=name, attributes={"Arn": table["TableArn"]})

    # ----------------------------------------------------------------- IAM --
    def _role(self, logical_id: str, props: dict[str, Any]) -> Created:
        name = props.get("RoleName") or self._name(logical_id)
        arn = f"arn:aws:iam::{self._resolver.account_id}:role/{name}"
        return Created(ref=name, attributes={"Arn": arn, "RoleId": f"AROA{name[:16].upper()}"})

    def _managed_policy(self, logical_id: str, props: dict[str, Any]) -> Created:
        name = props.get("ManagedPolicyName") or self._name(logical_id)
        return Created(ref=f"arn:aws:iam::{self._resolver.account_id}:policy/{name}")

    # ----------------------------------------------------------------- KMS --
    def _kms_key(self, logical_id: str, props: dict[str, Any]) -> Created:
        kms = self._aws.kms
        metadata = kms.create_key(
            Description=props.get("Description", ""),
            Policy=json.dumps(props["KeyPolicy"]) if "KeyPolicy" in props else None,
        )["KeyMetadata"]
        if props.get("EnableKeyRotation"):
            kms.enable_key_rotation(KeyId=metadata["KeyId"])
        return Created(ref=metadata["KeyId"], attributes={"Arn": metadata["Arn"], "KeyId": metadata["KeyId"]})

    def _kms_alias(self, logical_id: str, props: dict[str, Any]) -> Created:
        self._aws.kms.create_alias(AliasName=props["AliasName"], TargetKeyId=props["TargetKeyId"])
        return Created(ref=props["AliasName"])

    # ----------------------------------------------------------------- EC2 --
    def _security_group(self, logical_id: str, props: dict[str, Any]) -> Created:
        ec2 = self._aws.ec2
        group_id = ec2.create_security_group(
            GroupName=props.get("GroupName") or self._name(logical_id),
            Description=props["GroupDescription"],
            VpcId=props["VpcId"],
        )["GroupId"]
        egress = props.get("SecurityGroupEgress")
        if egress is not None:
            # As CloudFormation does: stated egress rules replace the default allow-all rule.
            ec2.revoke_security_group_egress(
                GroupId=group_id, IpPermissions=[{"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]
            )
            ec2.authorize_security_group_egress(GroupId=group_id, IpPermissions=[_ip_permission(r) for r in egress])
        return Created(ref=group_id, attributes={"GroupId": group_id, "VpcId": props["VpcId"]})

    def _security_group_ingress(self, logical_id: str, props: dict[str, Any]) -> Created:
        self._aws.ec2.authorize_security_group_ingress(GroupId=props["GroupId"], IpPermissions=[_ip_permission(props)])
        return Created(ref=f"{props['GroupId']}-{logical_id}")

    def _security_group_egress(self, logical_id: str, props: dict[str, Any]) -> Created:
        self._aws.ec2.authorize_security_group_egress(GroupId=props["GroupId"], IpPermissions=[_ip_permission(props)])
        return Created(ref=f"{props['GroupId']}-{logical_id}")

    def _vpc_endpoint(self, logical_id: str, props: dict[str, Any]) -> Created:
        request: dict[str, Any] = {}
        if "PolicyDocument" in props:
            request["PolicyDocument"] = json.dumps(props["PolicyDocument"])
        endpoint = self._aws.ec2.create_vpc_endpoint(
            VpcId=props["VpcId"],
            ServiceName=props["ServiceName"],
            VpcEndpointType=props.get("VpcEndpointType", "Gateway"),
            RouteTableIds=list(props.get("RouteTableIds", [])),
            **request,
        )["VpcEndpoint"]
        return Created(ref=endpoint["VpcEndpointId"], attributes={"Id": endpoint["VpcEndpointId"]})

    # ---------------------------------------------------------- CloudWatch --
    def _alarm(self, logical_id: str, props: dict[str, Any]) -> Created:
        name = props.get("AlarmName") or self._name(logical_id)
        request: dict[str, Any] = {key: value for key, value in props.items() if key in _ALARM_FIELDS}
        for key in ("Period", "EvaluationPeriods", "DatapointsToAlarm"):
            if key in request:
                request[key] = int(request[key])
        if "Threshold" in request:
            request["Threshold"] = float(request["Threshold"])
        self._aws.cloudwatch.put_metric_alarm(AlarmName=name, **request)
        return Created(ref=name, attributes={"Arn": self._arn("cloudwatch", f"alarm:{name}")})

    # ----------------------------------------------------------------- FSx --
    def _file_system(self, logical_id: str, props: dict[str, Any]) -> Created:
        lustre = dict(props.get("LustreConfiguration", {}))
        if "PerUnitStorageThroughput" in lustre:
            lustre["PerUnitStorageThroughput"] = int(lustre["PerUnitStorageThroughput"])
        created = self._aws.fsx.create_file_system(
            FileSystemType=props["FileSystemType"],
            StorageCapacity=int(props.get("StorageCapacity", 1200)),
            StorageType=props.get("StorageType", "SSD"),
            SubnetIds=list(props["SubnetIds"]),
            SecurityGroupIds=list(props.get("SecurityGroupIds", [])),
            LustreConfiguration=lustre,  # type: ignore[arg-type]
        )["FileSystem"]
        return Created(
            ref=created["FileSystemId"],
            attributes={
                "LustreMountName": created["LustreConfiguration"]["MountName"],
                "DNSName": created["DNSName"],
                "ResourceARN": created["ResourceARN"],
            },
        )

    def _repository_association(self, logical_id: str, props: dict[str, Any]) -> Created:
        request: dict[str, Any] = {
            key: props[key] for key in ("FileSystemId", "FileSystemPath", "DataRepositoryPath", "S3") if key in props
        }
        if "BatchImportMetaDataOnCreate" in props:
            request["BatchImportMetaDataOnCreate"] = str(props["BatchImportMetaDataOnCreate"]).lower() == "true"
        created = self._aws.fsx.create_data_repository_association(**request)["Association"]
        return Created(ref=created["AssociationId"], attributes={"AssociationId": created["AssociationId"]})

    # ----------------------------------------------------------- SageMaker --
    def _model_package_group(self, logical_id: str, props: dict[str, Any]) -> Created:
        name = props.get("ModelPackageGroupName") or self._name(logical_id)
        arn = self._aws.sagemaker.create_model_package_group(
            ModelPackageGroupName=name,
            ModelPackageGroupDescription=props.get("ModelPackageGroupDescription", ""),
        )["ModelPackageGroupArn"]
        return Created(ref=arn, attributes={"ModelPackageGroupArn": arn})

    # ----------------------------------------------------------------- SNS --
    def _topic(self, logical_id: str, props: dict[str, Any]) -> Created:
        name = props.get("TopicName") or self._name(logical_id)
        attributes: dict[str, str] = {key: str(props[key]) for key in ("DisplayName", "KmsMasterKeyId") if key in props}
        arn = self._aws.sns.create_topic(Name=name, Attributes=attributes)["TopicArn"]
        return Created(ref=arn, attributes={"TopicArn": arn, "TopicName": name})

    def _topic_policy(self, logical_id: str, props: dict[str, Any]) -> None:
        for topic in props["Topics"]:
            self._aws.sns.set_topic_attributes(
                TopicArn=topic, AttributeName="Policy", AttributeValue=json.dumps(props["PolicyDocument"])
            )

    def _subscription(self, logical_id: str, props: dict[str, Any]) -> Created:
        arn = self._aws.sns.subscribe(
            TopicArn=props["TopicArn"], Protocol=props["Protocol"], Endpoint=props["Endpoint"]
        )["SubscriptionArn"]
        return Created(ref=arn)

    # ----------------------------------------------------- Secrets Manager --
    def _secret(self, logical_id: str, props: dict[str, Any]) -> Created:
        name = props.get("Name") or self._name(logical_id)
        value = props.get("SecretString")
        generate = props.get("GenerateSecretString")
        if value is None and generate is not None:
            value = _generated_secret(generate)
        arn = self._aws.secretsmanager.create_secret(
            Name=name, SecretString=value or "", Description=props.get("Description", "")
        )["ARN"]
        return Created(ref=arn, attributes={"Id": arn})

    def _secret_resource_policy(self, logical_id: str, props: dict[str, Any]) -> Created:
        # moto stores a secret's policy without enforcing it (nor its conditions): put as written,
        # so `retrain local up` shows the same policy; the functions' reads are unaffected offline.
        self._aws.secretsmanager.put_resource_policy(
            SecretId=props["SecretId"],
            ResourcePolicy=json.dumps(props["ResourcePolicy"]),
            BlockPublicPolicy=str(props.get("BlockPublicPolicy", False)).lower() == "true",
        )
        return Created(ref=props["SecretId"], attributes={"Id": props["SecretId"]})

    # ---------------------------------------------------------------- Logs --
    def _log_group(self, logical_id: str, props: dict[str, Any]) -> Created:
        name = props.get("LogGroupName") or self._name(logical_id)
        self._aws.logs.create_log_group(logGroupName=name)
        if "RetentionInDays" in props:
            self._aws.logs.put_retention_policy(logGroupName=name, retentionInDays=int(props["RetentionInDays"]))
        return Created(ref=name, attributes={"Arn": self._arn("logs", f"log-group:{name}:*")})

    # ------------------------------------------------------------- Lambda --
    def _function(self, logical_id: str, props: dict[str, Any]) -> Created:
        merged = _with_globals(self._resolver.resolve(self._template.function_globals), props)
        name = merged.get("FunctionName") or self._name(logical_id)
        environment = {key: str(value) for key, value in merged.get("Environment", {}).get("Variables", {}).items()}
        spec = FunctionSpec(
            logical_id=logical_id,
            name=name,
            handler=merged["Handler"],
            environment=environment,
            timeout_seconds=int(merged.get("Timeout", 3)),
            memory_mb=int(merged.get("MemorySize", 128)),
            events=merged.get("Events", {}),
            reserved_concurrency=(
                int(merged["ReservedConcurrentExecutions"]) if "ReservedConcurrentExecutions" in merged else None
            ),
        )
        self._stack.functions.append(spec)
        for event_name, event in spec.events.items():
            self._event_source(spec, event_name, event)
        arn = self._arn("lambda", f"function:{name}")
        return Created(ref=name, attributes={"Arn": arn})

    def _event_source(self, spec: FunctionSpec, event_name: str, event: dict[str, Any]) -> None:
        kind, props = event.get("Type"), event.get("Properties", {})
        if kind == "SQS":
            queue_arn = props["Queue"]
            queue_name = queue_arn.rsplit(":", 1)[-1]
            url = self._aws.sqs.get_queue_url(QueueName=queue_name)["QueueUrl"]
            self._stack.mappings.append(
                EventSourceMapping(
                    function=spec.name,
                    queue_url=url,
                    queue_arn=queue_arn,
                    batch_size=int(props.get("BatchSize", 10)),
                    batching_window_seconds=float(props.get("MaximumBatchingWindowInSeconds", 0)),
                    report_batch_item_failures="ReportBatchItemFailures" in props.get("FunctionResponseTypes", []),
                    maximum_concurrency=(
                        int(props["ScalingConfig"]["MaximumConcurrency"]) if "ScalingConfig" in props else None
                    ),
                )
            )
        elif kind in {"Schedule", "ScheduleV2"}:
            payload = json.loads(props["Input"]) if "Input" in props else None
            self._stack.schedules.append(
                Schedule(
                    function=spec.name,
                    rule_name=props.get("Name") or f"{spec.name}-{event_name}",
                    expression=props.get("Schedule") or props["ScheduleExpression"],
                    payload=payload,
                )
            )
        elif kind == "EventBridgeRule":
            self._event_rule(spec, event_name, props)
        else:
            raise TemplateError(
                f"{spec.logical_id}.Events.{event_name} is a {kind} event, which the offline stack cannot deliver"
            )

    def _event_rule(self, spec: FunctionSpec, event_name: str, props: dict[str, Any]) -> None:
        """A rule on the default bus with the function as its target: created in moto (so it is
        listed as on AWS) and given to the stack's event bus, which delivers what matches."""
        where = f"{spec.logical_id}.Events.{event_name}"
        reshaped = sorted(set(props) & {"Input", "InputPath", "InputTransformer"})
        if reshaped:
            raise TemplateError(
                f"{where} sets {', '.join(reshaped)}: the offline stack delivers the matched event itself, "
                "as it is; give the function the whole event and let it pick what it needs"
            )
        unknown = sorted(set(props) - _RULE_PROPERTIES)
        if unknown:
            raise TemplateError(f"{where}: the offline stack does not know {', '.join(unknown)} of an EventBridgeRule")
        bus = str(props.get("EventBusName", DEFAULT_BUS))
        if bus.rsplit("/", 1)[-1] != DEFAULT_BUS:
            raise TemplateError(f"{where}: the offline stack has only the default event bus, not {bus}")
        pattern = props.get("Pattern")
        if not isinstance(pattern, dict) or not pattern:
            raise TemplateError(f"{where} needs a Pattern (a map)")
        for unplayed in ("RetryPolicy", "DeadLetterConfig"):
            if unplayed in props:
                log.info("%s: %s is not played offline (a refused delivery is logged)", where, unplayed)
        rule_name = str(props.get("RuleName") or f"{spec.name}-{event_name}")[:64]
        state = props.get("State", "ENABLED")
        if state not in ("ENABLED", "DISABLED"):
            raise TemplateError(f"{where}: State is ENABLED or DISABLED, not {state!r}")
        enabled = state == "ENABLED"
        function_arn = self._arn("lambda", f"function:{spec.name}")
        target_id = str(props.get("Target", {}).get("Id") or f"{spec.logical_id}{event_name}LambdaTarget")[:64]
        try:
            compile_pattern(pattern, rule_name)
            self._aws.events.put_rule(
                Name=rule_name, EventPattern=json.dumps(pattern), State="ENABLED" if enabled else "DISABLED"
            )
            self._aws.events.put_targets(Rule=rule_name, Targets=[{"Id": target_id, "Arn": function_arn}])
        except (ClientError, EventBusError, ValueError) as error:
            raise TemplateError(f"{where}: EventBridge refuses the rule: {error}") from None
        self._stack.rules.append(
            EventRule(function=function_arn, rule_name=rule_name, pattern=pattern, enabled=enabled)
        )

    # -------------------------------------------------------- EventBridge --
    def _events_rule(self, logical_id: str, props: dict[str, Any]) -> Created:
        """A rule with targets other than the stack's functions (a topic): created in moto, so it
        is listed and described as on AWS. Nothing offline emits the AWS events it matches
        (CloudTrail's), and the stack's event bus delivers to functions only."""
        name = str(props.get("Name") or self._name(logical_id))[:64]
        if "EventPattern" not in props:
            raise TemplateError(f"{logical_id}: the offline stack knows only rules with an EventPattern")
        events = self._aws.events
        try:
            compile_pattern(props["EventPattern"], name)
            arn = events.put_rule(
                Name=name,
                EventPattern=json.dumps(props["EventPattern"]),
                State=props.get("State", "ENABLED"),
                Description=props.get("Description", ""),
            )["RuleArn"]
            targets = [
                {key: target[key] for key in ("Id", "Arn", "Input", "InputPath", "InputTransformer") if key in target}
                for target in props.get("Targets", [])
            ]
            if targets:
                events.put_targets(Rule=name, Targets=targets)  # type: ignore[arg-type]
        except (ClientError, EventBusError, ValueError) as error:
            raise TemplateError(f"{logical_id}: EventBridge refuses the rule: {error}") from None
        return Created(ref=name, attributes={"Arn": arn})

    # ------------------------------------------------------- Step Functions --
    def _state_machine(self, logical_id: str, props: dict[str, Any]) -> Created:
        name = props.get("Name") or self._name(logical_id)
        definition_path = self._template.path.parent / props["DefinitionUri"]
        definition = substitute_definition(definition_path, props.get("DefinitionSubstitutions", {}))
        request: dict[str, Any] = {}
        if "Logging" in props:
            request["loggingConfiguration"] = _state_machine_logging(props["Logging"])
        arn = self._aws.stepfunctions.create_state_machine(
            name=name,
            definition=definition,
            roleArn=f"arn:aws:iam::{self._resolver.account_id}:role/{name}-role",
            type=props.get("Type", "STANDARD"),
            **request,
        )["stateMachineArn"]
        return Created(ref=arn, attributes={"Arn": arn, "Name": name})


def substitute_definition(path: Path, substitutions: dict[str, Any]) -> str:
    """The ASL with `${Name}` replaced, as SAM's DefinitionSubstitutions would."""
    text = path.read_text(encoding="utf-8")
    for name, value in substitutions.items():
        text = text.replace("${" + name + "}", str(value))
    if PLACEHOLDER in text:
        start = text.index(PLACEHOLDER)
        raise TemplateError(f"{path} keeps a placeholder with no substitution: {text[start:][:60]}")
    json.loads(text)  # a substitution must not break the JSON
    return text


def _with_globals(globals_: dict[str, Any], props: dict[str, Any]) -> dict[str, Any]:
    """SAM's Globals merge: maps merge (the function wins), everything else is overridden."""
    merged = dict(globals_)
    for key, value in props.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _with_globals(merged[key], value)
        else:
            merged[key] = value
    return merged


# SAM's EventBridgeRule event properties the offline stack honours (or, for RetryPolicy and
# DeadLetterConfig, accepts without playing); Input, InputPath and InputTransformer it refuses.
_RULE_PROPERTIES = frozenset(
    {"Pattern", "RuleName", "State", "EventBusName", "Target", "RetryPolicy", "DeadLetterConfig"}
)

# CloudFormation's AWS::CloudWatch::Alarm properties that PutMetricAlarm takes under the same name.
_ALARM_FIELDS = frozenset(
    {
        "AlarmDescription", "ActionsEnabled", "AlarmActions", "OKActions", "InsufficientDataActions",
        "MetricName", "Namespace", "Statistic", "ExtendedStatistic", "Dimensions", "Period", "Unit",
        "EvaluationPeriods", "DatapointsToAlarm", "Threshold", "ComparisonOperator", "TreatMissingData",
        "EvaluateLowSampleCountPercentile", "Metrics", "ThresholdMetricId",
    }
)  # fmt: skip


def _lifecycle_rule(rule: dict[str, Any]) -> dict[str, Any]:
    """CloudFormation's lifecycle rule in the S3 API's shape (the two name several members differently)."""
    api: dict[str, Any] = {"ID": rule["Id"], "Status": rule["Status"], "Filter": {"Prefix": rule.get("Prefix", "")}}
    expiration: dict[str, Any] = {}
    if "ExpirationInDays" in rule:
        expiration["Days"] = int(rule["ExpirationInDays"])
    if "ExpiredObjectDeleteMarker" in rule:
        expiration["ExpiredObjectDeleteMarker"] = bool(rule["ExpiredObjectDeleteMarker"])
    if expiration:
        api["Expiration"] = expiration
    if "NoncurrentVersionExpiration" in rule:
        api["NoncurrentVersionExpiration"] = {
            "NoncurrentDays": int(rule["NoncurrentVersionExpiration"]["NoncurrentDays"])
        }
    if "AbortIncompleteMultipartUpload" in rule:
        days = int(rule["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"])
        api["AbortIncompleteMultipartUpload"] = {"DaysAfterInitiation": days}
    return api


def _ip_permission(rule: dict[str, Any]) -> dict[str, Any]:
    """One CloudFormation ingress or egress rule as an EC2 IpPermission."""
    permission: dict[str, Any] = {"IpProtocol": str(rule["IpProtocol"])}
    if "FromPort" in rule:
        permission["FromPort"] = int(rule["FromPort"])
        permission["ToPort"] = int(rule["ToPort"])
    description = {"Description": rule["Description"]} if "Description" in rule else {}
    if "CidrIp" in rule:
        permission["IpRanges"] = [{"CidrIp": rule["CidrIp"], **description}]
    group = rule.get("SourceSecurityGroupId") or rule.get("DestinationSecurityGroupId")
    if group:
        permission["UserIdGroupPairs"] = [{"GroupId": group, **description}]
    if "DestinationPrefixListId" in rule:
        permission["PrefixListIds"] = [{"PrefixListId": rule["DestinationPrefixListId"], **description}]
    unknown = sorted(set(rule) - _IP_PERMISSION_FIELDS)
    if unknown:
        raise TemplateError(f"a security group rule's {', '.join(unknown)} is not known to the offline stack")
    return permission


# What `_ip_permission` turns into an EC2 IpPermission (GroupId names the rule's own group).
_IP_PERMISSION_FIELDS = frozenset(
    {
        "IpProtocol", "FromPort", "ToPort", "Description", "CidrIp", "SourceSecurityGroupId",
        "DestinationSecurityGroupId", "DestinationPrefixListId", "GroupId",
    }
)  # fmt: skip


def _state_machine_logging(logging_config: dict[str, Any]) -> dict[str, Any]:
    """SAM's Logging property in the Step Functions API's (camel-case) shape."""
    return {
        "level": logging_config.get("Level", "OFF"),
        "includeExecutionData": bool(logging_config.get("IncludeExecutionData", False)),
        "destinations": [
            {"cloudWatchLogsLogGroup": {"logGroupArn": d["CloudWatchLogsLogGroup"]["LogGroupArn"]}}
            for d in logging_config.get("Destinations", [])
        ],
    }


def _encryption_rule(rule: dict[str, Any]) -> dict[str, Any]:
    # CloudFormation and the S3 API spell the default-encryption member differently.
    api_rule = {key: value for key, value in rule.items() if key != "ServerSideEncryptionByDefault"}
    if "ServerSideEncryptionByDefault" in rule:
        api_rule["ApplyServerSideEncryptionByDefault"] = rule["ServerSideEncryptionByDefault"]
    return api_rule


def _queue_notification(config: dict[str, Any]) -> dict[str, Any]:
    notification: dict[str, Any] = {"QueueArn": config["Queue"], "Events": [config["Event"]]}
    rules = config.get("Filter", {}).get("S3Key", {}).get("Rules", [])
    if rules:
        notification["Filter"] = {"Key": {"FilterRules": [{"Name": r["Name"], "Value": r["Value"]} for r in rules]}}
    return notification


def _generated_secret(spec: dict[str, Any]) -> str:
    alphabet = string.ascii_letters + string.digits
    generated = "".join(secrets.choice(alphabet) for _ in range(int(spec.get("PasswordLength", 32))))
    template = spec.get("SecretStringTemplate")
    if template is None:
        return generated
    document = json.loads(template)
    document[spec["GenerateStringKey"]] = generated
    return json.dumps(document)
