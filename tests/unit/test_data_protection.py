"""Who can take the images out, read them, delete them, or read the Slack webhook: template.yaml's
network rules and resource policies (the S3 endpoint's, the bucket's, the key's, the secret's)
and the uploaders' policy, each read as AWS would evaluate it for a principal's request.

Offline, moto leaves conditional Deny statements out and enforces no key or secret policy, so
these guarantees are checked here, on the template, for every principal the stack knows.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from functions.training_job.images import DEBUGGER_RULE_ACCOUNTS, PYTORCH_TRAINING_ACCOUNTS
from retrain.local.cloudformation.template import TemplateError
from tests import iam
from tests.permissions import PERMISSIONS

ADMIN = f"arn:aws:iam::{iam.ACCOUNT}:role/Administrator"
AUDITOR = f"arn:aws:iam::{iam.ACCOUNT}:role/Auditor"
ANNOTATOR = f"arn:aws:iam::{iam.ACCOUNT}:role/munich-annotators"
ENDPOINT_PARAMETERS = {"PrivateRouteTableIds": "rtb-0fake"}
# Where a request comes from: the stack's S3 endpoint, or anywhere else.
VIA_ENDPOINT = {"aws:SourceVpce": "retrain-test-S3GatewayEndpoint", "aws:SourceVpc": "vpc-0fake"}
OUTSIDE: dict[str, Any] = {}
# The prefixes whose objects are the images, their labels, and what is made from them.
PROTECTED = ("dataset/", "quarantine/", "models/", "training/")


@pytest.fixture(scope="module")
def body() -> dict[str, Any]:
    return iam.template().body


def properties(body: dict[str, Any], logical_id: str, **parameters: str) -> Any:
    resolver = iam.fake_resolver(body, **parameters)
    return resolver.resolve(copy.deepcopy(body["Resources"][logical_id]["Properties"]))


def bucket(body: dict[str, Any]) -> str:
    return f"arn:aws:s3:::{iam.fake_resolver(body).resolve({'Ref': 'DataBucket'})}"


def stack_role(body: dict[str, Any], logical_id: str) -> str:
    return iam.role_arn(logical_id)


def roles(body: dict[str, Any]) -> list[str]:
    """Every function and role with policies of its own (not the uploaders' managed policy)."""
    return [
        logical_id
        for logical_id in PERMISSIONS
        if body["Resources"][logical_id]["Type"] in {"AWS::Serverless::Function", "AWS::IAM::Role"}
    ]


# ------------------------------------------------------------------ network --
def test_nothing_in_the_template_sends_traffic_to_the_internet(body: dict[str, Any]) -> None:
    egress: list[dict[str, Any]] = []
    for resource in body["Resources"].values():
        if resource["Type"] == "AWS::EC2::SecurityGroup":
            egress += resource["Properties"].get("SecurityGroupEgress", [])
        elif resource["Type"] == "AWS::EC2::SecurityGroupEgress":
            egress.append(resource["Properties"])

    open_rules = [rule for rule in egress if rule.get("CidrIp") == "0.0.0.0/0" or rule.get("CidrIpv6") == "::/0"]
    assert open_rules == [], "egress to the whole internet"
    stated = body["Resources"]["TrainingSecurityGroup"]["Properties"].get("SecurityGroupEgress")
    assert stated, "a group that states no egress gets AWS's allow-all rule"
    for rule in egress:
        to_s3 = rule.get("DestinationPrefixListId") == {"Ref": "S3PrefixListId"} and rule["FromPort"] == 443
        to_peers = rule.get("DestinationSecurityGroupId") == {"Fn::GetAtt": ["TrainingSecurityGroup", "GroupId"]}
        assert to_s3 or to_peers, f"egress to somewhere other than S3 or the group's own members: {rule}"


def test_the_s3_endpoint_has_a_policy_that_reaches_this_stacks_bucket_only(body: dict[str, Any]) -> None:
    props = properties(body, "S3GatewayEndpoint", **ENDPOINT_PARAMETERS)
    assert "PolicyDocument" in props, "without a policy, a gateway endpoint reaches every bucket"
    policy = iam.resource_policy(props["PolicyDocument"])
    anyone = f"arn:aws:iam::{iam.ACCOUNT}:role/anything-in-the-subnets"
    ours = bucket(body)

    assert iam.allowed_by(policy, anyone, iam.Need("s3:GetObject", f"{ours}/dataset/images/b/x.jpg"))
    assert iam.allowed_by(policy, anyone, iam.Need("s3:PutObject", f"{ours}/training/job/output/model.tar.gz"))
    for elsewhere in ("arn:aws:s3:::someone-elses-bucket", f"arn:aws:s3:::prod-{iam.REGION}-starport-layer-bucket"):
        assert not iam.allowed_by(policy, anyone, iam.Need("s3:PutObject", f"{elsewhere}/copy-of-the-dataset.tar")), (
            f"the dataset can be copied to {elsewhere} through the endpoint"
        )
    assert not iam.allowed_by(policy, anyone, iam.Need("s3:ListBucket", "arn:aws:s3:::someone-elses-bucket"))
    # What an ECR pull through an interface endpoint needs: the image layers, read only.
    layer = f"arn:aws:s3:::prod-{iam.REGION}-starport-layer-bucket/layer-0123"
    assert iam.allowed_by(policy, anyone, iam.Need("s3:GetObject", layer))


# The operator lists are another rule's (tests/unit/test_role_names.py).
OPEN = {"OpenOperatorAccess": "true"}


def test_a_stack_that_creates_its_security_group_needs_the_s3_prefix_list(body: dict[str, Any]) -> None:
    rules = body["Rules"]
    with pytest.raises(TemplateError, match="S3PrefixListId"):
        iam.fake_resolver(body, S3PrefixListId="", **OPEN).check_rules(rules)
    iam.fake_resolver(body, S3PrefixListId="", TrainingSecurityGroupIds="sg-0mine", **OPEN).check_rules(rules)
    iam.fake_resolver(body, **OPEN).check_rules(rules)


# ------------------------------------------------------------------- bucket --
def data_bucket_policy(body: dict[str, Any], **parameters: str) -> list[iam.ResourceStatement]:
    return iam.resource_policy(properties(body, "DataBucketPolicy", **parameters)["PolicyDocument"])


@pytest.mark.parametrize(
    ("who", "action", "key", "where", "denied"),
    [
        # An administrator whose IAM allows s3:* on '*' reads no image from their laptop ...
        ("admin", "s3:GetObject", "dataset/images/munich-1/x.jpg", OUTSIDE, True),
        ("admin", "s3:GetObjectVersion", "quarantine/munich-1/images/x.jpg", OUTSIDE, True),
        ("admin", "s3:GetObject", "incoming/munich-1/images/x.jpg", OUTSIDE, True),
        ("admin", "s3:GetObject", "models/accepted.json", OUTSIDE, True),
        ("admin", "s3:PutObject", "dataset/manifests/forged.jsonl", OUTSIDE, True),
        # ... but the bucket policy leaves requests through the training VPC's endpoint to IAM.
        ("admin", "s3:GetObject", "dataset/images/munich-1/x.jpg", VIA_ENDPOINT, False),
        # The stack's own roles work from wherever they run.
        ("IntakeFunction", "s3:PutObject", "dataset/images/munich-1/x.jpg", OUTSIDE, False),
        ("TrainingRole", "s3:PutObject", "training/job/output/model.tar.gz", OUTSIDE, False),
        ("PrepareRunFunction", "s3:GetObject", "dataset/manifests/v1.jsonl", OUTSIDE, False),
        # A role of the stack with no business there is refused like anyone else.
        ("NotifyFunction", "s3:GetObject", "dataset/images/munich-1/x.jpg", OUTSIDE, True),
        # Annotators upload under incoming/ and read reports; they do not read uploads back.
        ("annotator", "s3:PutObject", "incoming/munich-1/images/x.jpg", OUTSIDE, False),
        ("annotator", "s3:GetObject", "reports/batches/munich-1/report.json", OUTSIDE, False),
        ("annotator", "s3:GetObject", "incoming/munich-2/images/y.jpg", OUTSIDE, True),
    ],
)
def test_the_images_leave_the_bucket_only_through_the_endpoint_or_to_the_stacks_roles(
    body: dict[str, Any], who: str, action: str, key: str, where: dict[str, Any], denied: bool
) -> None:
    principal = {"admin": ADMIN, "annotator": ANNOTATOR}.get(who) or stack_role(body, who)
    policy = data_bucket_policy(body, **ENDPOINT_PARAMETERS)

    assert iam.denied_by(policy, principal, iam.Need(action, f"{bucket(body)}/{key}", where)) is denied


def test_without_the_stacks_endpoint_any_endpoint_of_the_training_vpc_is_the_way_in(body: dict[str, Any]) -> None:
    policy = data_bucket_policy(body)  # PrivateRouteTableIds empty: the deployer's endpoint
    image = f"{bucket(body)}/dataset/images/b/x.jpg"

    assert not iam.denied_by(policy, ADMIN, iam.Need("s3:GetObject", image, {"aws:SourceVpc": "vpc-0fake"}))
    assert iam.denied_by(policy, ADMIN, iam.Need("s3:GetObject", image, {"aws:SourceVpc": "vpc-0other"}))
    assert iam.denied_by(policy, ADMIN, iam.Need("s3:GetObject", image))


def test_the_readers_the_deployer_names_read_the_images_and_nobody_else(body: dict[str, Any]) -> None:
    image = iam.Need("s3:GetObject", f"{bucket(body)}/dataset/images/b/x.jpg")

    assert iam.denied_by(data_bucket_policy(body), AUDITOR, image)
    named = data_bucket_policy(body, DataReaderArns=AUDITOR)
    assert not iam.denied_by(named, AUDITOR, image)
    assert iam.denied_by(named, ADMIN, image)


WRITTEN_ONCE = {"s3:if-none-match": "*"}


def test_every_role_the_permissions_send_to_the_images_gets_there_and_no_other(body: dict[str, Any]) -> None:
    """The bucket policy's exemptions and tests/permissions.py agree: whatever a role is
    granted under the protected prefixes, the Deny lets it do from outside the endpoint; a role
    granted nothing there is refused (on AWS only: moto leaves conditional Denies out)."""
    policy = data_bucket_policy(body)
    ours = bucket(body)
    for logical_id in roles(body):
        principal = stack_role(body, logical_id)
        # Writes of the approval evidence are always conditional (EvidenceIsWrittenOnce, tested
        # in test_permissions.py): here the question is only where a request may come from.
        needs = [
            iam.Need(
                action, resource.format(bucket=ours).replace("*", "x"), WRITTEN_ONCE if action == "s3:PutObject" else {}
            )
            for grant in PERMISSIONS[logical_id]
            for action in grant.actions
            if action.startswith("s3:") and "Object" in action
            for resource in grant.resources
            if resource.startswith("{bucket}/") and resource.removeprefix("{bucket}/").startswith(PROTECTED)
        ]
        refused = [str(need) for need in needs if iam.denied_by(policy, principal, need)]
        assert refused == [], f"{logical_id} is granted these, but the bucket policy denies them: {refused}"
        if not needs:
            image = iam.Need("s3:GetObject", f"{ours}/dataset/images/b/x.jpg")
            assert iam.denied_by(policy, principal, image), f"{logical_id} needs no image, yet may read one"


@pytest.mark.parametrize(
    "key",
    [
        "dataset/images/munich-1/x.jpg",
        "dataset/labels/munich-1/x.png",
        "dataset/manifests/v1.jsonl",
        "models/accepted.json",
    ],
)
def test_only_the_erasure_role_deletes_versions_of_the_curated_zone_and_the_models(
    body: dict[str, Any], key: str
) -> None:
    policy = data_bucket_policy(body, **ENDPOINT_PARAMETERS)
    delete = iam.Need("s3:DeleteObjectVersion", f"{bucket(body)}/{key}", VIA_ENDPOINT)

    for principal in (ADMIN, stack_role(body, "IntakeFunction"), stack_role(body, "TrainingRole")):
        assert iam.denied_by(policy, principal, delete), f"{principal} may delete a version of {key}"
    assert not iam.denied_by(policy, stack_role(body, "ErasureRole"), delete)
    # The intake still removes landing copies by version.
    landing = iam.Need("s3:DeleteObjectVersion", f"{bucket(body)}/incoming/munich-1/images/x.jpg")
    assert not iam.denied_by(policy, stack_role(body, "IntakeFunction"), landing)


def test_operators_assume_the_erasure_role_as_the_deployer_decides(body: dict[str, Any]) -> None:
    def trusted(**parameters: str) -> Any:
        (statement,) = properties(body, "ErasureRole", **parameters)["AssumeRolePolicyDocument"]["Statement"]
        return statement["Principal"]["AWS"]

    assert trusted() == f"arn:aws:iam::{iam.ACCOUNT}:root", "by default the account's IAM decides"
    assert trusted(ErasureOperatorArns=AUDITOR) == [AUDITOR]


# ---------------------------------------------------------------------- key --
def key_policy(body: dict[str, Any], **parameters: str) -> list[iam.ResourceStatement]:
    return iam.resource_policy(properties(body, "DataKey", **parameters)["KeyPolicy"])


def key_arn(body: dict[str, Any]) -> str:
    return str(iam.fake_resolver(body).resolve({"Fn::GetAtt": ["DataKey", "Arn"]}))


def through_s3(**extra: str) -> dict[str, str]:
    bucket_name = f"{iam.STACK}-data-{iam.ACCOUNT}-{iam.REGION}"
    return {
        "kms:ViaService": f"s3.{iam.REGION}.amazonaws.com",
        "kms:EncryptionContext:aws:s3:arn": f"arn:aws:s3:::{bucket_name}",
        "kms:CallerAccount": iam.ACCOUNT,
        **extra,
    }


def granted_context(conditions: tuple[str, ...]) -> dict[str, str]:
    """A request that meets a grant's declared conditions (`Op:key=value`, or `Op:key` for any)."""
    context = through_s3()
    for spec in conditions:
        key, _, value = spec.split(":", 1)[1].partition("=")
        context[key] = value.format(region=iam.REGION) or "true"
    return context


def test_the_account_administers_the_key_and_only_the_stacks_roles_use_it(body: dict[str, Any]) -> None:
    policy, key = key_policy(body), key_arn(body)

    for action in ("kms:DescribeKey", "kms:PutKeyPolicy", "kms:EnableKeyRotation", "kms:ScheduleKeyDeletion"):
        assert iam.allowed_by(policy, ADMIN, iam.Need(action, key)), f"the key cannot be managed: {action}"
    for action in ("kms:Decrypt", "kms:GenerateDataKey", "kms:ReEncryptFrom", "kms:CreateGrant", "kms:Encrypt"):
        assert not iam.allowed_by(policy, ADMIN, iam.Need(action, key, through_s3())), (
            f"an administrator's IAM is enough for {action}: the images are readable by anyone IAM lets decrypt"
        )
    # Every role tests/permissions.py grants the key may use it, as declared; the others may not.
    for logical_id in roles(body):
        principal = stack_role(body, logical_id)
        uses = [
            iam.Need(action, key, granted_context(grant.conditions))
            for grant in PERMISSIONS[logical_id]
            if "{key}" in grant.resources
            for action in grant.actions
        ]
        for need in uses:
            assert iam.allowed_by(policy, principal, need), (
                f"{logical_id} is granted {need.action} on the key ({dict(need.context)}), the key policy refuses it"
            )
        if not uses:
            assert not iam.allowed_by(policy, principal, iam.Need("kms:Decrypt", key, through_s3())), logical_id


def test_key_administration_can_be_narrowed_to_named_administrators(body: dict[str, Any]) -> None:
    key_admin = f"arn:aws:iam::{iam.ACCOUNT}:role/KeyAdmin"
    policy, key = key_policy(body, KeyAdministratorArns=key_admin), key_arn(body)

    assert iam.allowed_by(policy, key_admin, iam.Need("kms:PutKeyPolicy", key))
    assert not iam.allowed_by(policy, ADMIN, iam.Need("kms:PutKeyPolicy", key))
    assert not iam.allowed_by(policy, key_admin, iam.Need("kms:Decrypt", key, through_s3()))


def test_named_readers_decrypt_through_s3_only(body: dict[str, Any]) -> None:
    key = key_arn(body)
    decrypt = iam.Need("kms:Decrypt", key, through_s3())

    assert not iam.allowed_by(key_policy(body), AUDITOR, decrypt)
    named = key_policy(body, DataReaderArns=AUDITOR)
    assert iam.allowed_by(named, AUDITOR, decrypt)
    assert not iam.allowed_by(named, AUDITOR, iam.Need("kms:Decrypt", key, {"kms:CallerAccount": iam.ACCOUNT}))


@pytest.mark.parametrize(
    ("team", "context", "allowed"),
    [
        ("munich", through_s3(), True),
        ("paris", through_s3(), False),  # not one of AnnotationTeams
        (None, through_s3(), False),
        ("munich", through_s3(**{"kms:EncryptionContext:aws:s3:arn": "arn:aws:s3:::other"}), False),
        ("munich", {"kms:CallerAccount": iam.ACCOUNT}, False),  # directly, not through S3
    ],
)
def test_annotation_teams_use_the_key_only_to_upload_to_and_read_this_bucket(
    body: dict[str, Any], team: str | None, context: dict[str, str], allowed: bool
) -> None:
    tags = {"aws:PrincipalTag/retrain-team": team} if team else {}
    need = iam.Need("kms:GenerateDataKey", key_arn(body), {**context, **tags})

    assert iam.allowed_by(key_policy(body), ANNOTATOR, need) is allowed


# ------------------------------------------------------------------- secret --
def test_only_notify_function_reads_the_slack_webhook(body: dict[str, Any]) -> None:
    props = properties(body, "SlackWebhookSecretPolicy")
    assert props["SecretId"] == iam.fake_resolver(body).resolve({"Ref": "SlackWebhookSecret"})
    policy = iam.resource_policy(props["ResourcePolicy"])
    secret = iam.placeholders(body, iam.fake_resolver(body))["secret"]
    read = iam.Need("secretsmanager:GetSecretValue", secret)

    assert not iam.denied_by(policy, stack_role(body, "NotifyFunction"), read)
    for other in (ADMIN, stack_role(body, "TrainingRole"), stack_role(body, "EvaluateRunFunction")):
        assert iam.denied_by(policy, other, read), f"{other} may read the webhook"
    assert not iam.denied_by(policy, ADMIN, iam.Need("secretsmanager:PutSecretValue", secret)), (
        "the deployer stores the URL after deploying"
    )


# ---------------------------------------------------------------- uploaders --
@pytest.mark.parametrize(
    ("team", "action", "key", "allowed"),
    [
        ("munich", "s3:PutObject", "incoming/munich-12/images/x.jpg", True),
        ("munich", "s3:PutObject", "incoming/munich-12/_COMPLETE", True),
        ("munich", "s3:PutObject", "incoming/berlin-3/images/x.jpg", False),  # another team's batch
        ("munich", "s3:PutObject", "incoming/munichx-1/images/x.jpg", False),
        ("munich", "s3:AbortMultipartUpload", "incoming/berlin-3/images/x.jpg", False),
        ("munich", "s3:GetObject", "reports/batches/munich-12/report.json", True),
        ("munich", "s3:GetObject", "reports/batches/berlin-3/report.json", False),
        ("munich", "s3:GetObject", "reports/runs/ds-1/report.html", False),
        ("paris", "s3:PutObject", "incoming/paris-1/images/x.jpg", False),  # not a declared team
        (None, "s3:PutObject", "incoming/munich-12/images/x.jpg", False),  # an untagged principal
    ],
)
def test_each_annotation_team_writes_and_reads_only_its_own_batches(
    body: dict[str, Any], team: str | None, action: str, key: str, allowed: bool
) -> None:
    statements = iam.statements_of(body, "AnnotationUploaderPolicy", iam.fake_resolver(body))
    tags = {"aws:PrincipalTag/retrain-team": team} if team else {}

    assert iam.allowed(statements, iam.Need(action, f"{bucket(body)}/{key}", tags)) is allowed


def test_a_team_lists_its_own_batches_only_and_without_declared_teams_nobody_uploads(body: dict[str, Any]) -> None:
    statements = iam.statements_of(body, "AnnotationUploaderPolicy", iam.fake_resolver(body))
    munich = {"aws:PrincipalTag/retrain-team": "munich"}

    assert iam.allowed(
        statements, iam.Need("s3:ListBucket", bucket(body), {**munich, "s3:prefix": "incoming/munich-12/"})
    )
    assert not iam.allowed(statements, iam.Need("s3:ListBucket", bucket(body), {**munich, "s3:prefix": "incoming/"}))
    nobody = iam.statements_of(body, "AnnotationUploaderPolicy", iam.fake_resolver(body, AnnotationTeams=""))
    upload = iam.Need("s3:PutObject", f"{bucket(body)}/incoming/munich-12/images/x.jpg", munich)
    assert not iam.allowed(nobody, upload)


# ------------------------------------------------------------------- images --
def test_training_images_are_pulled_only_from_aws_registry_accounts(body: dict[str, Any]) -> None:
    statements = iam.statements_of(body, "TrainingRole", iam.fake_resolver(body))
    pytorch, rules = PYTORCH_TRAINING_ACCOUNTS[iam.REGION], DEBUGGER_RULE_ACCOUNTS[iam.REGION]

    def pull(account: str, repository: str) -> bool:
        arn = f"arn:aws:ecr:{iam.REGION}:{account}:repository/{repository}"
        return iam.allowed(statements, iam.Need("ecr:BatchGetImage", arn))

    assert pull(pytorch, "pytorch-training") and pull(rules, "sagemaker-debugger-rules")
    assert not pull("444455556666", "pytorch-training"), "a look-alike repository in another account"
    assert not pull("444455556666", "sagemaker-debugger-rules")


def test_the_templates_registry_accounts_are_the_ones_the_builder_uses(body: dict[str, Any]) -> None:
    expected = {
        region: {"PyTorch": account, "DebuggerRules": DEBUGGER_RULE_ACCOUNTS.get(region, account)}
        for region, account in PYTORCH_TRAINING_ACCOUNTS.items()
    }

    assert body["Mappings"]["TrainingImageRegistries"] == expected
    assert set(DEBUGGER_RULE_ACCOUNTS) <= set(PYTORCH_TRAINING_ACCOUNTS), "a Debugger region without PyTorch images"
