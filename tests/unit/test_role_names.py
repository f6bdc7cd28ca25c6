"""Exact principals: every role of the stack has a name of its own, and every resource policy that
lets the stack's roles in names each by that exact ARN.

Before, the key policy, the bucket's exemptions, the evidence writer, the Slack secret and the
report reader's trust matched `<stack>-<Function>Role-*`: anyone allowed iam:CreateRole could make
a role with a matching name and decrypt the images or write a run's evidence, without touching a
resource policy; and a stack name long enough for CloudFormation to truncate the generated role
names broke the match silently. Each test here fails against that template.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from retrain.local.cloudformation.template import TemplateError
from tests import iam

# The longest stack name whose role names all fit IAM's 64 characters: the Makefile's deploy
# refuses longer ones, and docs/deploy.md says so.
MAX_STACK_NAME_LENGTH = 48
IAM_ROLE_NAME_LIMIT = 64
FSX_ROLES = f"arn:aws:iam::{iam.ACCOUNT}:role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com"
EXISTING_FILE_SYSTEM = {"ExistingFileSystemId": "fs-0existing00000000", "ExistingFileSystemMountName": "abc"}
OPERATORS = {
    "TrainerReleasers": f"arn:aws:iam::{iam.ACCOUNT}:role/Deployer",
    "ErasureOperatorArns": f"arn:aws:iam::{iam.ACCOUNT}:role/DataProtectionOfficer",
    "KeyAdministratorArns": f"arn:aws:iam::{iam.ACCOUNT}:role/Admin",
}


@pytest.fixture(scope="module")
def body() -> dict[str, Any]:
    return iam.template().body


def resolved(body: dict[str, Any], *path: str, **parameters: str) -> Any:
    node: Any = body["Resources"]
    for step in path:
        node = node[step]
    return iam.fake_resolver(body, **parameters).resolve(copy.deepcopy(node))


def trust_policy(body: dict[str, Any], role: str) -> list[iam.ResourceStatement]:
    """A role's trust policy as a resource policy (its statements name no Resource: the role)."""
    document = resolved(body, role, "Properties", "AssumeRolePolicyDocument")
    for statement in document["Statement"]:
        statement.setdefault("Resource", "*")
    return iam.resource_policy(document)


def roles(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {logical_id: r for logical_id, r in body["Resources"].items() if r["Type"] == "AWS::IAM::Role"}


# ------------------------------------------------------------------- names --
def test_every_role_has_a_name_of_its_stack_that_fits_iams_limit(body: dict[str, Any]) -> None:
    names = {}
    for logical_id, role in roles(body).items():
        name = role["Properties"].get("RoleName")
        assert isinstance(name, dict) and set(name) == {"Fn::Sub"}, (
            f"{logical_id}: no RoleName of its stack, so CloudFormation makes one up and policies guess it"
        )
        assert name["Fn::Sub"].startswith("${AWS::StackName}-"), f"{logical_id}: {name}"
        names[logical_id] = name["Fn::Sub"].replace("${AWS::StackName}", "s" * MAX_STACK_NAME_LENGTH)
    assert len(set(names.values())) == len(names), f"two roles share a name: {names}"
    too_long = {logical_id: name for logical_id, name in names.items() if len(name) > IAM_ROLE_NAME_LIMIT}
    assert too_long == {}, f"with a {MAX_STACK_NAME_LENGTH}-character stack name these exceed 64: {too_long}"


def test_every_function_and_the_state_machine_run_as_a_role_of_their_own(body: dict[str, Any]) -> None:
    runners = [
        logical_id
        for logical_id, resource in body["Resources"].items()
        if resource["Type"] in {"AWS::Serverless::Function", "AWS::Serverless::StateMachine"}
    ]
    own = {logical_id: iam.own_role(body, logical_id) for logical_id in runners}

    assert None not in own.values(), f"SAM would make (and name) a role: {own}"
    assert len(set(own.values())) == len(own), f"two share a role: {own}"
    for logical_id in runners:
        assert "Policies" not in body["Resources"][logical_id]["Properties"], f"{logical_id}: policies on its role"


def test_each_function_role_has_only_the_basics_beside_its_declared_policy(body: dict[str, Any]) -> None:
    """Logs, traces and (for the intake) the queue's polling: what SAM's generated role had from
    AWS managed policies, without logs:CreateLogGroup (the template makes the log groups)."""
    resolver = iam.fake_resolver(body)
    for logical_id, resource in body["Resources"].items():
        if resource["Type"] != "AWS::Serverless::Function":
            continue
        role = iam.own_role(body, logical_id)
        assert role is not None
        policies = {p["PolicyName"]: p for p in body["Resources"][role]["Properties"]["Policies"]}
        assert set(policies) == {"least-privilege", iam.LAMBDA_BASICS}, f"{role}: {sorted(policies)}"
        basics = resolver.resolve(copy.deepcopy(policies[iam.LAMBDA_BASICS]["PolicyDocument"]["Statement"]))
        granted = {(tuple(iam._values(s["Action"])), tuple(iam._values(s["Resource"]))) for s in basics}
        expected = {
            (
                ("logs:CreateLogStream", "logs:PutLogEvents"),
                (f"arn:aws:logs:{iam.REGION}:{iam.ACCOUNT}:log-group:/aws/lambda/*",),
            ),
            (("xray:PutTraceSegments", "xray:PutTelemetryRecords"), ("*",)),
        }
        if logical_id == "IntakeFunction":
            queue = resolver.resolve({"Fn::GetAtt": ["IntakeQueue", "Arn"]})
            expected.add((("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"), (queue,)))
        assert granted == expected, f"{role}: {granted}"
        assert all(s["Effect"] == "Allow" and "Condition" not in s for s in basics)


# -------------------------------------------------------- exact principals --
def _principal_conditions(node: Any, where: str) -> list[tuple[str, str, str]]:
    """(where, operator, value) of every aws:PrincipalArn condition value in a resolved node."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, dict) and "aws:PrincipalArn" in value:
                found += [(where, key, str(v)) for v in iam._values(value["aws:PrincipalArn"])]
            found += _principal_conditions(value, f"{where}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _principal_conditions(value, f"{where}[{index}]")
    return found


@pytest.mark.parametrize("file_system", ["created", "existing", "none"])
def test_every_stack_role_a_policy_names_is_named_exactly(body: dict[str, Any], file_system: str) -> None:
    parameters = {
        "created": {},
        "existing": EXISTING_FILE_SYSTEM,
        "none": {"DatasetSource": "s3"},
    }[file_system]
    resolver = iam.fake_resolver(body, **parameters)
    stack_roles = {str(resolver.resolve({"Fn::GetAtt": [logical_id, "Arn"]})) for logical_id in roles(body)}
    found = [
        entry
        for logical_id, resource in body["Resources"].items()
        if "Condition" not in resource or resolver.condition(resource["Condition"])
        for entry in _principal_conditions(resolver.resolve(copy.deepcopy(resource.get("Properties", {}))), logical_id)
    ]
    ours = [entry for entry in found if f":role/{iam.STACK}-" in entry[2]]

    assert len(ours) > 20, "the policies name the stack's roles: is this the template?"
    assert [e for e in ours if e[1] not in {"ArnEquals", "ArnNotEquals"}] == []
    assert [e for e in ours if "*" in e[2] or "?" in e[2]] == [], "a pattern matches roles others can create"
    assert {e[2] for e in ours} <= stack_roles, "a policy names a role the stack does not have"
    # FSx's role is this stack's file system's, except in the key policy for a file system the
    # stack creates (the key encrypts it: naming it there would be a cycle; the bucket refuses others).
    fsx = [e for e in found if e[2].startswith(FSX_ROLES)]
    patterns = [e for e in fsx if "*" in e[2]]
    expected = [] if file_system == "existing" else ["DataKey.KeyPolicy.Statement[5].Condition"]
    assert [e[0] for e in patterns] == expected


IMPOSTORS = [
    # What the old patterns matched: `<stack>-<Function>Role-*`, creatable by anyone with iam:CreateRole.
    f"arn:aws:iam::{iam.ACCOUNT}:role/{iam.STACK}-IntakeFunctionRole-Impostor1",
    f"arn:aws:iam::{iam.ACCOUNT}:role/{iam.STACK}-EvaluateRunFunctionRole-Impostor1",
    f"arn:aws:iam::{iam.ACCOUNT}:role/{iam.STACK}-NotifyFunctionRole-Impostor1",
    f"arn:aws:iam::{iam.ACCOUNT}:role/{iam.STACK}-TrainingRole-Impostor1",
    # Near misses of the new names.
    f"arn:aws:iam::{iam.ACCOUNT}:role/{iam.STACK}-intake-2",
    f"arn:aws:iam::{iam.ACCOUNT}:role/{iam.STACK}-evaluate-run2",
    f"arn:aws:iam::{iam.ACCOUNT}:role/path/{iam.STACK}-notify",
]


@pytest.mark.parametrize("impostor", IMPOSTORS)
def test_a_role_named_like_the_stacks_roles_gets_none_of_their_rights(body: dict[str, Any], impostor: str) -> None:
    key = str(iam.fake_resolver(body).resolve({"Fn::GetAtt": ["DataKey", "Arn"]}))
    bucket = f"arn:aws:s3:::{iam.fake_resolver(body).resolve({'Ref': 'DataBucket'})}"
    data_bucket = f"arn:aws:s3:::{iam.STACK}-data-{iam.ACCOUNT}-{iam.REGION}"
    through_s3 = {
        "kms:ViaService": f"s3.{iam.REGION}.amazonaws.com",
        "kms:EncryptionContext:aws:s3:arn": data_bucket,
        "kms:CallerAccount": iam.ACCOUNT,
    }
    key_policy = iam.resource_policy(resolved(body, "DataKey", "Properties", "KeyPolicy"))
    bucket_policy = iam.resource_policy(resolved(body, "DataBucketPolicy", "Properties", "PolicyDocument"))
    secret_policy = iam.resource_policy(resolved(body, "SlackWebhookSecretPolicy", "Properties", "ResourcePolicy"))
    reader_trust = trust_policy(body, "ReportReaderRole")
    secret = str(iam.fake_resolver(body).resolve({"Ref": "SlackWebhookSecret"}))

    assert not iam.allowed_by(key_policy, impostor, iam.Need("kms:Decrypt", key, through_s3))
    assert not iam.allowed_by(key_policy, impostor, iam.Need("kms:GenerateDataKey", key, through_s3))
    assert iam.denied_by(bucket_policy, impostor, iam.Need("s3:GetObject", f"{bucket}/dataset/images/b/x.jpg"))
    assert iam.denied_by(bucket_policy, impostor, iam.Need("s3:GetObject", f"{bucket}/incoming/b/images/x.jpg"))
    evidence = iam.Need("s3:PutObject", f"{bucket}/reports/runs/ds-1/metrics.json", {"s3:if-none-match": "*"})
    assert iam.denied_by(bucket_policy, impostor, evidence)
    assert iam.denied_by(secret_policy, impostor, iam.Need("secretsmanager:GetSecretValue", secret))
    assert not iam.allowed_by(reader_trust, impostor, iam.Need("sts:AssumeRole", "*"))


def test_the_stacks_own_roles_keep_their_rights(body: dict[str, Any]) -> None:
    """The other side of the impostor test: the named roles still pass the same statements."""
    bucket = f"arn:aws:s3:::{iam.fake_resolver(body).resolve({'Ref': 'DataBucket'})}"
    bucket_policy = iam.resource_policy(resolved(body, "DataBucketPolicy", "Properties", "PolicyDocument"))
    secret_policy = iam.resource_policy(resolved(body, "SlackWebhookSecretPolicy", "Properties", "ResourcePolicy"))
    reader_trust = trust_policy(body, "ReportReaderRole")
    secret = str(iam.fake_resolver(body).resolve({"Ref": "SlackWebhookSecret"}))
    evidence = iam.Need("s3:PutObject", f"{bucket}/reports/runs/ds-1/metrics.json", {"s3:if-none-match": "*"})

    assert not iam.denied_by(bucket_policy, iam.role_arn("EvaluateRunFunction"), evidence)
    assert not iam.denied_by(
        bucket_policy, iam.role_arn("IntakeFunction"), iam.Need("s3:GetObject", f"{bucket}/dataset/images/b/x.jpg")
    )
    assert not iam.denied_by(
        secret_policy, iam.role_arn("NotifyFunction"), iam.Need("secretsmanager:GetSecretValue", secret)
    )
    assert iam.allowed_by(reader_trust, iam.role_arn("NotifyFunction"), iam.Need("sts:AssumeRole", "*"))


# --------------------------------------------------------------------- FSx --
@pytest.mark.parametrize(
    ("parameters", "ours"),
    [
        ({}, "fs-0fake0000000000"),  # the file system the stack creates (tests/iam.py's fake id)
        (EXISTING_FILE_SYSTEM, "fs-0existing00000000"),
    ],
)
def test_only_the_stacks_file_system_reads_the_data_through_fsx(
    body: dict[str, Any], parameters: dict[str, str], ours: str
) -> None:
    bucket = f"arn:aws:s3:::{iam.fake_resolver(body).resolve({'Ref': 'DataBucket'})}"
    policy = iam.resource_policy(resolved(body, "DataBucketPolicy", "Properties", "PolicyDocument", **parameters))
    image = iam.Need("s3:GetObject", f"{bucket}/dataset/images/b/x.jpg")

    assert not iam.denied_by(policy, f"{FSX_ROLES}/AWSServiceRoleForFSxS3Access_{ours}", image)
    assert iam.denied_by(policy, f"{FSX_ROLES}/AWSServiceRoleForFSxS3Access_fs-0another000000000", image)


def test_without_a_file_system_no_fsx_role_reads_the_data(body: dict[str, Any]) -> None:
    bucket = f"arn:aws:s3:::{iam.fake_resolver(body).resolve({'Ref': 'DataBucket'})}"
    policy = iam.resource_policy(resolved(body, "DataBucketPolicy", "Properties", "PolicyDocument", DatasetSource="s3"))
    image = iam.Need("s3:GetObject", f"{bucket}/dataset/images/b/x.jpg")

    assert iam.denied_by(policy, f"{FSX_ROLES}/AWSServiceRoleForFSxS3Access_fs-0fake0000000000", image)


# --------------------------------------------------------------- operators --
@pytest.mark.parametrize("empty", sorted(OPERATORS))
def test_the_stack_is_refused_while_an_operator_list_is_empty(body: dict[str, Any], empty: str) -> None:
    with pytest.raises(TemplateError, match=f"OperatorsAreNamed: Name who .* in {empty}"):
        iam.fake_resolver(body, **{**OPERATORS, empty: ""}).check_rules(body["Rules"])


def test_named_operators_or_a_deliberate_open_access_deploy(body: dict[str, Any]) -> None:
    iam.fake_resolver(body, **OPERATORS).check_rules(body["Rules"])
    iam.fake_resolver(body, OpenOperatorAccess="true").check_rules(body["Rules"])
