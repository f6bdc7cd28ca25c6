"""Least privilege, statically: template.yaml grants every function and role exactly what
tests/permissions.py declares, nothing forbidden anywhere, and the conditions that confine
training jobs hold. The calls the functions really make are checked against the same statements
in tests/integration/test_least_privilege.py."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from retrain.local.cloudformation.resources import substitute_definition
from retrain.local.cloudformation.template import Resolver
from tests import iam
from tests.permissions import FUNCTION_PLACEHOLDERS, PERMISSIONS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def body() -> dict[str, Any]:
    return iam.template().body


def resolved(body: dict[str, Any], logical_id: str, **parameters: str) -> list[iam.Statement]:
    return iam.statements_of(body, logical_id, iam.fake_resolver(body, **parameters))


def test_every_function_and_role_is_granted_exactly_what_it_declares(body: dict[str, Any]) -> None:
    assert iam.check_template(body, iam.fake_resolver(body)) == []


def test_every_principal_with_policies_in_the_template_has_a_declaration(body: dict[str, Any]) -> None:
    # A function's or state machine's own role is declared as the function.
    own_roles = {iam.own_role(body, logical_id): logical_id for logical_id in body["Resources"]}
    holders = {
        own_roles.get(logical_id, logical_id)
        for logical_id, resource in body["Resources"].items()
        if resource["Type"] in {"AWS::IAM::Role", "AWS::IAM::ManagedPolicy", "AWS::IAM::Policy"}
        or (resource["Type"].startswith("AWS::Serverless::") and "Policies" in resource.get("Properties", {}))
    }
    assert holders == set(PERMISSIONS), "a principal without a declaration, or a declaration without a principal"


def test_every_function_has_a_placeholder_for_its_arn(body: dict[str, Any]) -> None:
    """tests/integration/test_least_privilege.py checks the grants of the functions named here."""
    functions = {logical_id for logical_id, r in body["Resources"].items() if r["Type"] == "AWS::Serverless::Function"}
    missing = sorted(functions - set(FUNCTION_PLACEHOLDERS))
    assert not missing, f"add these to FUNCTION_PLACEHOLDERS in tests/permissions.py (logical id: folder): {missing}"
    assert set(FUNCTION_PLACEHOLDERS) <= functions, "FUNCTION_PLACEHOLDERS names a function the template lacks"


def test_every_grant_says_why(body: dict[str, Any]) -> None:
    for logical_id, grants in PERMISSIONS.items():
        for grant in grants:
            assert len(grant.why) > 10, f"{logical_id}: {grant.actions} needs a reason"


def test_no_statement_grants_lifecycle_policy_or_acl_actions(body: dict[str, Any]) -> None:
    assert iam.forbidden_grants(body) == []


def test_wildcard_resources_are_only_where_aws_allows_no_other(body: dict[str, Any]) -> None:
    resolver = iam.fake_resolver(body)
    wildcard_actions = {
        action
        for logical_id in PERMISSIONS
        for statement in iam.statements_of(body, logical_id, resolver)
        if "*" in statement.resources
        for action in statement.actions
    }
    assert {a.split(":")[0] for a in wildcard_actions} <= {
        "logs",
        "xray",
        "ecr",
        "cloudwatch",
        "ec2",
        "sagemaker",
        "states",
    }
    # A run's wait is answered with its task token: SendTask* have no resource-level permissions.
    assert {a for a in wildcard_actions if a.startswith("states:")} == {
        "states:SendTaskSuccess",
        "states:SendTaskFailure",
        "states:SendTaskHeartbeat",
    }
    # SageMaker's List* actions have no resource-level permissions (the safety poll lists the
    # stack's jobs by name prefix, and then touches only `{jobs}`).
    assert {a for a in wildcard_actions if a.startswith(("sagemaker:", "ecr:", "logs:Create", "logs:Put"))} == {
        "sagemaker:ListModelPackages",
        "sagemaker:ListTrainingJobs",
        "ecr:GetAuthorizationToken",
        "logs:CreateLogDelivery",
        "logs:PutResourcePolicy",
    }


# ---------------------------------------------------------- broken copies --
def _statements(body: dict[str, Any], logical_id: str) -> list[dict[str, Any]]:
    """The statements of a function's least-privilege policy, on its own role."""
    role = iam.own_role(body, logical_id) or logical_id
    for entry in body["Resources"][role]["Properties"]["Policies"]:
        if entry["PolicyName"] != iam.LAMBDA_BASICS:
            statements: list[dict[str, Any]] = entry["PolicyDocument"]["Statement"]
            return statements
    raise AssertionError(f"{logical_id} has no Statement")


def test_a_copy_missing_a_needed_statement_fails_the_check(body: dict[str, Any]) -> None:
    broken = copy.deepcopy(body)
    statements = _statements(broken, "IntakeFunction")
    statements[:] = [s for s in statements if s["Action"] != "s3:DeleteObjectVersion"]

    problems = iam.check_template(broken, iam.fake_resolver(broken))

    assert any(p.startswith("IntakeFunction: lacks s3:DeleteObjectVersion on arn:aws:s3:::") for p in problems), (
        problems
    )


@pytest.mark.parametrize(
    ("action", "resource", "forbidden"),
    [
        ("s3:DeleteObject", {"Fn::Sub": "arn:${AWS::Partition}:s3:::${DataBucket}/dataset/manifests/*"}, False),
        ("s3:PutObject", {"Fn::Sub": "arn:${AWS::Partition}:s3:::${DataBucket}/dataset/manifests/*"}, False),
        ("s3:PutBucketPolicy", {"Fn::Sub": "arn:${AWS::Partition}:s3:::${DataBucket}"}, True),
        ("s3:PutLifecycleConfiguration", {"Fn::Sub": "arn:${AWS::Partition}:s3:::${DataBucket}"}, True),
        ("s3:*", {"Fn::Sub": "arn:${AWS::Partition}:s3:::${DataBucket}/*"}, True),
    ],
)
def test_a_copy_granting_one_action_more_fails_the_check(
    body: dict[str, Any], action: str, resource: dict[str, Any], forbidden: bool
) -> None:
    broken = copy.deepcopy(body)
    _statements(broken, "IntakeFunction").append({"Effect": "Allow", "Action": action, "Resource": resource})

    problems = iam.check_template(broken, iam.fake_resolver(broken))

    assert any(p.startswith(f"IntakeFunction: grants {action} on arn:aws:s3:::") for p in problems), problems
    assert bool(iam.forbidden_grants(broken)) is forbidden


def test_a_copy_that_drops_a_condition_fails_the_check(body: dict[str, Any]) -> None:
    broken = copy.deepcopy(body)
    (create,) = [s for s in _statements(broken, "TrainingJobFunction") if s["Action"] == "sagemaker:CreateTrainingJob"]
    del create["Condition"]["Bool"]

    problems = iam.check_template(broken, iam.fake_resolver(broken))

    assert any("lacks the conditions" in p and "InterContainerTrafficEncryption" in p for p in problems), problems


def test_a_sam_policy_template_is_refused(body: dict[str, Any]) -> None:
    broken = copy.deepcopy(body)
    broken["Resources"]["TriggerFunction"]["Properties"]["Policies"] = [
        {"S3CrudPolicy": {"BucketName": {"Ref": "DataBucket"}}}
    ]

    with pytest.raises(AssertionError, match="grants outside explicit statements"):
        iam.check_template(broken, iam.fake_resolver(broken))


# ------------------------------------------------------------ training jobs --
def _job_need(resolver: Resolver, body: dict[str, Any], **context: Any) -> iam.Need:
    names = iam.placeholders(body, resolver)
    job = names["jobs"].removesuffix("*") + "ds-2026-01-01-abcdef12"
    good = {
        "sagemaker:VpcSubnets": ["subnet-0aaa", "subnet-0bbb"],
        "sagemaker:VpcSecurityGroupIds": ["sg-0fake"],
        "sagemaker:VolumeKmsKey": names["key"],
        "sagemaker:OutputKmsKey": names["key"],
        "sagemaker:InterContainerTrafficEncryption": "true",
        "sagemaker:NetworkIsolation": "true",
    }
    merged = {key: value for key, value in {**good, **context}.items() if value is not None}
    return iam.Need("sagemaker:CreateTrainingJob", job, merged)


@pytest.mark.parametrize(
    ("context", "allowed"),
    [
        ({}, True),
        ({"sagemaker:VpcSubnets": ["subnet-0aaa"]}, True),
        ({"sagemaker:VpcSubnets": ["subnet-0aaa", "subnet-elsewhere"]}, False),
        ({"sagemaker:VpcSubnets": None, "sagemaker:VpcSecurityGroupIds": None}, False),
        ({"sagemaker:VpcSecurityGroupIds": ["sg-open-to-all"]}, False),
        ({"sagemaker:VolumeKmsKey": None}, False),
        ({"sagemaker:OutputKmsKey": "arn:aws:kms:eu-west-1:111122223333:key/other"}, False),
        ({"sagemaker:InterContainerTrafficEncryption": "false"}, False),
        ({"sagemaker:InterContainerTrafficEncryption": None}, False),
        # A job whose code could reach the network could send the dataset anywhere its subnets reach.
        ({"sagemaker:NetworkIsolation": "false"}, False),
        ({"sagemaker:NetworkIsolation": None}, False),
    ],
)
def test_training_jobs_are_created_only_in_the_vpc_isolated_and_encrypted(
    body: dict[str, Any], context: dict[str, Any], allowed: bool
) -> None:
    resolver = iam.fake_resolver(body)
    statements = iam.statements_of(body, "TrainingJobFunction", resolver)

    assert iam.allowed(statements, _job_need(resolver, body, **context)) is allowed


def test_only_this_stacks_jobs_and_role_are_touched(body: dict[str, Any]) -> None:
    resolver = iam.fake_resolver(body)
    statements = iam.statements_of(body, "TrainingJobFunction", resolver)
    need = _job_need(resolver, body)
    other_job = need.resource.replace(f"retrain-{iam.stack_uuid_prefix(resolver)}-", "retrain-0000beef-")
    role = iam.placeholders(body, resolver)["training_role"]

    assert not iam.allowed(statements, iam.Need(need.action, other_job, need.context))
    assert not iam.allowed(statements, iam.Need("sagemaker:StopTrainingJob", other_job))
    assert iam.allowed(statements, iam.Need("iam:PassRole", role, {"iam:PassedToService": "sagemaker.amazonaws.com"}))
    assert not iam.allowed(statements, iam.Need("iam:PassRole", role, {"iam:PassedToService": "ec2.amazonaws.com"}))
    assert not iam.allowed(
        statements, iam.Need("iam:PassRole", role.replace("TrainingRole", "Admin"), {"iam:PassedToService": "x"})
    )


def test_the_job_name_prefix_is_this_stacks_and_fits_the_job_configuration(body: dict[str, Any]) -> None:
    from functions.training_job.config import JobConfig  # noqa: PLC0415

    resolver = iam.fake_resolver(body)
    env = resolver.resolve(body["Resources"]["TrainingJobFunction"]["Properties"]["Environment"]["Variables"])
    prefix = env["TRAINING_JOB_JOB_NAME_PREFIX"]
    pattern = JobConfig.model_fields["job_name_prefix"].metadata[0].pattern

    assert prefix == f"retrain-{iam.stack_uuid_prefix(resolver)}"
    assert re.fullmatch(pattern, prefix) and prefix == prefix.lower(), "SageMaker's ARNs name jobs in lowercase"
    assert iam.placeholders(body, resolver)["jobs"].endswith(f"training-job/{prefix}-*")


def test_the_file_system_granted_is_the_one_the_stack_uses(body: dict[str, Any]) -> None:
    existing = "fs-0123456789abcdef0"
    for parameters, expected in (({}, "fs-0fake0000000000"), ({"ExistingFileSystemId": existing}, existing)):
        statements = resolved(body, "DatasetSyncFunction", **parameters)
        arn = f"arn:aws:fsx:{iam.REGION}:{iam.ACCOUNT}:file-system/{expected}"
        assert iam.allowed(statements, iam.Need("fsx:CreateDataRepositoryTask", arn))
        assert not iam.allowed(statements, iam.Need("fsx:CreateDataRepositoryTask", arn + "0"))


def test_with_the_dataset_on_s3_training_reads_dataset_and_nothing_touches_fsx(body: dict[str, Any]) -> None:
    bucket = f"arn:aws:s3:::{iam.fake_resolver(body).resolve({'Ref': 'DataBucket'})}"
    on_s3 = {"DatasetSource": "s3"}
    training, training_on_fsx = resolved(body, "TrainingRole", **on_s3), resolved(body, "TrainingRole")
    sync = resolved(body, "DatasetSyncFunction", **on_s3)

    read = iam.Need("s3:GetObject", f"{bucket}/dataset/images/b/x.jpg")
    assert iam.allowed(training, read), "the FastFile channel reads dataset/ as the training role"
    assert not iam.allowed(training_on_fsx, read), "with FSx, the role never reads dataset/ from S3"
    assert not [s for s in training + sync if any(action.startswith("fsx:") for action in s.actions)]


def test_the_state_machine_may_invoke_exactly_the_functions_its_definition_names(body: dict[str, Any]) -> None:
    resolver = iam.fake_resolver(body)
    props = body["Resources"]["RetrainStateMachine"]["Properties"]
    definition = json.loads(
        substitute_definition(ROOT / props["DefinitionUri"], resolver.resolve(props["DefinitionSubstitutions"]))
    )
    invoked: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("Type") == "Task":
                resource = node["Resource"]
                if resource.startswith("arn:aws:states:::lambda:invoke"):
                    # The Lambda integration (`.waitForTaskToken`): the function is a parameter.
                    resource = node["Parameters"]["FunctionName"]
                assert resource.startswith("arn:aws:lambda:"), f"a Task of another kind is not modelled: {resource}"
                invoked.add(resource)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(definition)
    statements = iam.statements_of(body, "RetrainStateMachine", resolver)
    granted = {r for s in statements if "lambda:InvokeFunction" in s.actions for r in s.resources}

    assert granted == invoked


# ------------------------------------------------------------ trainer code --
CODE_SHA256 = "4e1d" * 16


def _code_write(resolver: Any, action: str, principal: str | None, key: str) -> iam.Need:
    bucket = f"arn:aws:s3:::{resolver.resolve({'Ref': 'DataBucket'})}"
    context = {"aws:SecureTransport": "true"}
    if principal is not None:
        context["aws:PrincipalArn"] = principal
    return iam.Need(action, f"{bucket}/{key}", context)


@pytest.mark.parametrize("action", ["s3:PutObject", "s3:DeleteObject", "s3:DeleteObjectVersion"])
@pytest.mark.parametrize("key", [f"code/{CODE_SHA256}/sourcedir.tar.gz", "code/current.json"])
def test_only_the_release_role_may_write_or_delete_the_trainer_whatever_s3_rights_others_hold(
    body: dict[str, Any], action: str, key: str
) -> None:
    resolver = iam.fake_resolver(body)
    denials = iam.bucket_denials(body, "DataBucketPolicy", resolver)
    release_role = resolver.resolve({"Fn::GetAtt": ["TrainerReleaseRole", "Arn"]})
    others = {
        "the training role (runs the code)": iam.placeholders(body, resolver)["training_role"],
        "a function's role": iam.role_arn("IntakeFunction"),
        "an engineer with s3:* on the bucket": f"arn:aws:iam::{iam.ACCOUNT}:role/ml-engineer",
        "another account's role": "arn:aws:iam::444455556666:role/admin",
        "an anonymous caller": None,
    }

    for who, principal in others.items():
        assert iam.denied(denials, _code_write(resolver, action, principal, key)), f"{who} is not denied {action}"
    assert not iam.denied(denials, _code_write(resolver, action, release_role, key)), "the release path is denied"
    # Nothing else: the training role still reads the code, and writes its output elsewhere (as
    # the role CloudFormation names, which the data-protection statements recognise).
    training_role = iam.role_arn("TrainingRole")
    assert not iam.denied(denials, _code_write(resolver, "s3:GetObject", training_role, key))
    assert not iam.denied(denials, _code_write(resolver, action, training_role, "training/job/output/model.tar.gz"))


@pytest.mark.parametrize(
    ("releasers", "condition"),
    [
        ("", None),
        (
            "arn:aws:iam::111122223333:role/ml-release,arn:aws:iam::111122223333:role/ci-*",
            {
                "ArnEquals": {
                    "aws:PrincipalArn": [
                        "arn:aws:iam::111122223333:role/ml-release",
                        "arn:aws:iam::111122223333:role/ci-*",
                    ]
                }
            },
        ),
    ],
)
def test_who_may_release_is_the_accounts_iam_or_the_named_releasers(
    body: dict[str, Any], releasers: str, condition: dict[str, Any] | None
) -> None:
    resolver = iam.fake_resolver(body, TrainerReleasers=releasers)
    trust = resolver.resolve(body["Resources"]["TrainerReleaseRole"]["Properties"]["AssumeRolePolicyDocument"])

    (statement,) = trust["Statement"]
    assert statement["Principal"] == {"AWS": f"arn:aws:iam::{iam.ACCOUNT}:root"}, "this account's principals only"
    assert statement.get("Condition") == condition


# ------------------------------------------- the evidence behind an approval (issue 28) --
RUN = "ds-20261203-091500-4f1c2a9b"
EVIDENCE_SIDS = ("OnlyTheEvaluationWritesRunEvidence", "EvidenceIsWrittenOnce", "EvidenceIsNeverDeleted")


def _principal_arn(body: dict[str, Any], logical_id: str) -> str:
    """Who a principal's requests come from, as `aws:PrincipalArn` names it on AWS."""
    if body["Resources"][logical_id]["Type"] == "AWS::IAM::ManagedPolicy":  # the annotation teams' users
        return f"arn:aws:iam::{iam.ACCOUNT}:user/annotator"
    return iam.role_arn(logical_id)


def _as(body: dict[str, Any], logical_id: str, action: str, key: str, **context: Any) -> bool:
    """May `logical_id` do `action` on the data bucket's `key`: its own statements and the bucket
    policy's evidence statements together, as S3 decides for a principal of the same account."""
    resolver = iam.fake_resolver(body)
    statements = iam.statements_of(body, logical_id, resolver)
    statements += iam.bucket_policy_denials(body, resolver, EVIDENCE_SIDS)
    bucket = iam.placeholders(body, resolver)["bucket"]
    need = iam.Need(action, f"{bucket}/{key}", {"aws:PrincipalArn": _principal_arn(body, logical_id), **context})
    return iam.allowed(statements, need)


@pytest.mark.parametrize(
    "key",
    [
        f"reports/runs/{RUN}/metrics.json",
        f"reports/runs/{RUN}/summary.json",
        f"models/packages/{RUN}/model.tar.gz",
    ],
)
def test_only_the_evaluation_may_write_a_runs_evidence_or_a_sealed_model(body: dict[str, Any], key: str) -> None:
    writers = {
        logical_id
        for logical_id in PERMISSIONS
        if _as(body, logical_id, "s3:PutObject", key, **{"s3:if-none-match": "*"})
    }

    assert writers == {"EvaluateRunFunction"}, f"{key} may be written by {sorted(writers)}"


def test_a_later_job_cannot_overwrite_or_remove_the_registered_models_artifact(body: dict[str, Any]) -> None:
    sealed = f"models/packages/{RUN}/model.tar.gz"

    assert _as(body, "TrainingRole", "s3:PutObject", "training/retrain-job-2/output/model.tar.gz")
    assert not _as(body, "TrainingRole", "s3:PutObject", sealed, **{"s3:if-none-match": "*"})
    assert not _as(body, "TrainingRole", "s3:DeleteObject", sealed)
    assert _as(body, "EvaluateRunFunction", "s3:PutObject", sealed, **{"s3:if-none-match": "*"})
    assert not _as(body, "EvaluateRunFunction", "s3:PutObject", sealed), "only a write that cannot replace"


def test_the_metrics_a_package_pins_are_written_once_and_the_summary_as_often_as_needed(body: dict[str, Any]) -> None:
    metrics, summary = f"reports/runs/{RUN}/metrics.json", f"reports/runs/{RUN}/summary.json"

    assert _as(body, "EvaluateRunFunction", "s3:PutObject", metrics, **{"s3:if-none-match": "*"})
    assert not _as(body, "EvaluateRunFunction", "s3:PutObject", metrics)
    assert _as(body, "EvaluateRunFunction", "s3:PutObject", summary), "rewritten after the commit point"


def test_not_even_an_administrator_rewrites_the_evidence_or_deletes_a_sealed_model(body: dict[str, Any]) -> None:
    resolver = iam.fake_resolver(body)
    bucket = iam.placeholders(body, resolver)["bucket"]
    administrator = [iam.Statement(("s3:*",), ("*",)), *iam.bucket_policy_denials(body, resolver, EVIDENCE_SIDS)]
    who = {"aws:PrincipalArn": f"arn:aws:iam::{iam.ACCOUNT}:role/Admin", "s3:if-none-match": "*"}

    def may(action: str, key: str) -> bool:
        return iam.allowed(administrator, iam.Need(action, f"{bucket}/{key}", who))

    assert may("s3:PutObject", "reports/batches/munich/report.md"), "the statements deny only the evidence"
    assert not may("s3:PutObject", f"reports/runs/{RUN}/metrics.json")
    assert not may("s3:PutObject", f"models/packages/{RUN}/model.tar.gz")
    assert not may("s3:DeleteObject", f"models/packages/{RUN}/model.tar.gz")
    assert not may("s3:DeleteObjectVersion", f"models/packages/{RUN}/model.tar.gz")


def _ledger_need(body: dict[str, Any], action: str, partition: str) -> iam.Need:
    ledger = iam.placeholders(body, iam.fake_resolver(body))["ledger"]
    return iam.Need(action, ledger, {"dynamodb:LeadingKeys": [partition]})


def test_the_decoder_cannot_touch_the_run_lock_or_write_run_reports(body: dict[str, Any]) -> None:
    from functions.data.ledger_batches import LOCK_PK  # noqa: PLC0415

    intake = resolved(body, "IntakeFunction")

    for action in ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Query"):
        assert iam.allowed(intake, _ledger_need(body, action, "batch#munich")), action
        assert iam.allowed(intake, _ledger_need(body, action, "content#" + "ab" * 32)), action
        assert not iam.allowed(intake, _ledger_need(body, action, LOCK_PK)), f"{action} on the run lock"
        assert not iam.allowed(intake, _ledger_need(body, action, "run#ds-1")), f"{action} on a run's record"
    assert _as(body, "IntakeFunction", "s3:PutObject", "reports/batches/runs/report.json"), "a batch named runs"
    assert not _as(body, "IntakeFunction", "s3:PutObject", f"reports/runs/{RUN}/metrics.json")


def test_a_wider_allow_for_the_decoder_still_leaves_the_lock_trust_and_run_reports_refused(
    body: dict[str, Any],
) -> None:
    from functions.data.ledger_batches import LOCK_PK  # noqa: PLC0415

    broken = copy.deepcopy(body)
    for statement in _statements(broken, "IntakeFunction"):
        if statement["Effect"] == "Allow" and statement.get("Condition", {}).get("ForAllValues:StringLike"):
            del statement["Condition"]  # the ledger, every partition
    _statements(broken, "IntakeFunction").append(
        {
            "Effect": "Allow",
            "Action": "s3:PutObject",
            "Resource": {"Fn::Sub": "arn:${AWS::Partition}:s3:::${DataBucket}/reports/*"},
        }
    )
    intake = resolved(broken, "IntakeFunction")
    bucket = iam.placeholders(broken, iam.fake_resolver(broken))["bucket"]

    assert iam.allowed(intake, _ledger_need(broken, "dynamodb:PutItem", "run#ds-1")), "the copy is wider"
    assert not iam.allowed(intake, _ledger_need(broken, "dynamodb:PutItem", LOCK_PK))
    for action in TRUST_WRITES:
        assert not iam.allowed(intake, _ledger_need(broken, action, TRUST_ITEM)), f"{action} on a trust item"
    assert iam.allowed(intake, _ledger_need(broken, "dynamodb:GetItem", TRUST_ITEM)), "reading stays allowed"
    assert not iam.allowed(intake, iam.Need("s3:PutObject", f"{bucket}/reports/runs/{RUN}/metrics.json"))
    assert any("IntakeFunction: grants" in p for p in iam.check_template(broken, iam.fake_resolver(broken)))


# A pair's trust is earned by an independent judgement or given by a named person (issue 34).
TRUST_ITEM = "trust#munich-01"
TRUST_WRITES = ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem")


def test_the_decoder_reads_a_batchs_trust_for_its_report_and_never_writes_it(body: dict[str, Any]) -> None:
    intake = resolved(body, "IntakeFunction")

    assert iam.allowed(intake, _ledger_need(body, "dynamodb:GetItem", TRUST_ITEM)), "the batch report reads it"
    for action in TRUST_WRITES:
        assert not iam.allowed(intake, _ledger_need(body, action, TRUST_ITEM)), f"{action} on a trust item"
    assert not iam.allowed(intake, _ledger_need(body, "dynamodb:Query", TRUST_ITEM)), "it reads one item"
    # The batches themselves are still the intake's to write.
    assert iam.allowed(intake, _ledger_need(body, "dynamodb:PutItem", "batch#munich-01"))


def test_the_denied_trust_partition_is_the_one_the_code_writes(body: dict[str, Any]) -> None:
    from functions.data.ledger_trust import TRUST_PK_PREFIX, trust_pk  # noqa: PLC0415

    denied = [
        s
        for s in resolved(body, "IntakeFunction")
        if s.effect == "Deny" and any(a.startswith("dynamodb:") for a in s.actions) and "dynamodb:*" not in s.actions
    ]

    assert [s.conditions for s in denied] == [
        {"ForAnyValue:StringLike": {"dynamodb:LeadingKeys": f"{TRUST_PK_PREFIX}*"}}
    ], "the Deny names another partition than ledger_trust.py writes"
    assert trust_pk("munich-01") == TRUST_ITEM


def test_a_trust_operator_decides_trust_and_re_offers_pairs_and_touches_nothing_else(body: dict[str, Any]) -> None:
    from functions.data.ledger_batches import LOCK_PK  # noqa: PLC0415

    operator = resolved(body, "TrustOperatorRole")
    names = iam.placeholders(body, iam.fake_resolver(body))

    for action in ("dynamodb:GetItem", "dynamodb:PutItem"):
        assert iam.allowed(operator, _ledger_need(body, action, TRUST_ITEM)), f"{action} on a trust item"
    assert iam.allowed(operator, _ledger_need(body, "dynamodb:PutItem", "batch#munich-01")), "a released pair"
    assert iam.allowed(operator, _ledger_need(body, "dynamodb:UpdateItem", "batch#munich-01")), "its batch touched"
    assert iam.allowed(operator, _ledger_need(body, "dynamodb:GetItem", LOCK_PK)), "which run keeps its version"
    assert not iam.allowed(operator, _ledger_need(body, "dynamodb:PutItem", LOCK_PK)), "it may not take the lock"
    assert not iam.allowed(operator, _ledger_need(body, "dynamodb:PutItem", "content#" + "ab" * 32))
    assert not iam.allowed(operator, _ledger_need(body, "dynamodb:DeleteItem", TRUST_ITEM)), "forgetting is a purge"
    assert iam.allowed(operator, iam.Need("s3:PutObject", f"{names['bucket']}/reports/batches/munich-01/report.md"))
    assert not iam.allowed(operator, iam.Need("s3:GetObject", f"{names['bucket']}/dataset/images/munich-01/a.jpg"))
    assert not iam.allowed(operator, iam.Need("s3:GetObject", f"{names['bucket']}/reports/runs/{RUN}/report.html"))


@pytest.mark.parametrize(
    ("operators", "principal"),
    [
        ("", f"arn:aws:iam::{iam.ACCOUNT}:root"),
        ("arn:aws:iam::111122223333:role/ml-leads", ["arn:aws:iam::111122223333:role/ml-leads"]),
    ],
    ids=["the account's IAM decides", "named operators"],
)
def test_who_may_decide_trust_is_the_accounts_iam_or_the_named_operators(
    body: dict[str, Any], operators: str, principal: Any
) -> None:
    resolver = iam.fake_resolver(body, TrustOperatorArns=operators)
    trust = resolver.resolve(body["Resources"]["TrustOperatorRole"]["Properties"]["AssumeRolePolicyDocument"])

    (statement,) = trust["Statement"]
    assert statement["Principal"] == {"AWS": principal}
    assert body["Outputs"]["TrustOperatorRoleArn"]["Value"] == {"Fn::GetAtt": ["TrustOperatorRole", "Arn"]}


def test_the_denied_lock_is_the_one_the_code_takes(body: dict[str, Any]) -> None:
    from functions.data.ledger_batches import LOCK_PK  # noqa: PLC0415

    denied = [s for s in resolved(body, "IntakeFunction") if s.effect == "Deny" and "dynamodb:*" in s.actions]

    assert [s.conditions for s in denied] == [{"ForAnyValue:StringEquals": {"dynamodb:LeadingKeys": LOCK_PK}}]


# ------------------------------------------- who may free a run's lock (second review) --
def test_only_the_state_machine_and_run_ended_may_invoke_the_release(body: dict[str, Any]) -> None:
    """A function cannot tell who invoked it, so the boundary is IAM: the intake (which decodes
    untrusted images) and the sweeper may nudge the trigger, which frees no lock, and cannot
    invoke ReleaseFunction, which does."""
    names = iam.placeholders(body, iam.fake_resolver(body))
    release = iam.Need("lambda:InvokeFunction", names["release"])
    trigger = iam.Need("lambda:InvokeFunction", names["trigger"])

    invokers = {logical_id for logical_id in PERMISSIONS if iam.allowed(resolved(body, logical_id), release)}

    assert invokers == {"RetrainStateMachine", "RunEndedFunction"}
    for nudger in ("IntakeFunction", "SweeperFunction", "ReleaseFunction"):
        assert iam.allowed(resolved(body, nudger), trigger), f"{nudger} still asks the trigger to look"


def test_the_trigger_may_take_the_run_lock_and_never_free_it_and_the_release_touches_nothing_else(
    body: dict[str, Any],
) -> None:
    from functions.data.ledger_batches import LOCK_PK  # noqa: PLC0415

    trigger, release = resolved(body, "TriggerFunction"), resolved(body, "ReleaseFunction")

    assert iam.allowed(trigger, _ledger_need(body, "dynamodb:PutItem", LOCK_PK)), "it takes the lock for a run"
    assert not iam.allowed(trigger, _ledger_need(body, "dynamodb:DeleteItem", LOCK_PK))
    assert iam.allowed(release, _ledger_need(body, "dynamodb:DeleteItem", LOCK_PK))
    for action in ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"):
        assert not iam.allowed(release, _ledger_need(body, action, "batch#munich-01")), action
    assert not iam.allowed(release, _ledger_need(body, "dynamodb:PutItem", LOCK_PK)), "it takes no lock"


def test_a_run_end_the_function_keeps_failing_on_lands_in_a_queue_an_alarm_watches(body: dict[str, Any]) -> None:
    resolver = iam.fake_resolver(body)
    resources = body["Resources"]
    config = resources["RunEndedFunction"]["Properties"]["EventInvokeConfig"]
    queue = {"Fn::GetAtt": ["RunEndedFailureQueue", "Arn"]}

    assert config["MaximumRetryAttempts"] == 2
    assert config["DestinationConfig"]["OnFailure"] == {"Destination": queue}, (
        "no Type: SAM would add a SendMessage policy of its own, outside the declared statements"
    )
    assert resources["RunEndedFailureQueue"]["Properties"]["SqsManagedSseEnabled"] is True
    sends = iam.Need("sqs:SendMessage", resolver.resolve(queue))
    assert {p for p in PERMISSIONS if iam.allowed(resolved(body, p), sends)} == {"RunEndedFunction"}
    alarm = resources["RunEndedFailuresAlarm"]["Properties"]
    assert (alarm["Namespace"], alarm["MetricName"], alarm["Statistic"]) == (
        "AWS/SQS",
        "ApproximateNumberOfMessagesVisible",
        "Maximum",
    )
    assert alarm["Dimensions"] == [
        {"Name": "QueueName", "Value": {"Fn::GetAtt": ["RunEndedFailureQueue", "QueueName"]}}
    ]
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("GreaterThanOrEqualToThreshold", 1)
    assert alarm["AlarmActions"] == [{"Ref": "NotificationTopic"}]


def test_a_run_ends_record_is_written_by_the_release_and_claimed_by_notify_and_nothing_else_is(
    body: dict[str, Any],
) -> None:
    from functions.data.ledger_batches import LOCK_PK  # noqa: PLC0415
    from functions.data.ledger_run_ends import run_end_pk  # noqa: PLC0415

    end, release, notify = run_end_pk("ds-1"), resolved(body, "ReleaseFunction"), resolved(body, "NotifyFunction")

    assert iam.allowed(release, _ledger_need(body, "dynamodb:PutItem", end))
    assert iam.allowed(notify, _ledger_need(body, "dynamodb:UpdateItem", end))
    assert iam.allowed(notify, _ledger_need(body, "dynamodb:GetItem", end))
    for other in (LOCK_PK, "batch#munich-01", "trust#munich-01"):
        assert not iam.allowed(notify, _ledger_need(body, "dynamodb:GetItem", other)), other
    assert not iam.allowed(notify, _ledger_need(body, "dynamodb:DeleteItem", end))
