"""A small IAM model for the least-privilege tests: the template's statements per principal,
what tests/permissions.py declares, what an AWS call needs, and whether a statement allows it.

Only what this stack's policies use is modelled: Allow and Deny statements (an explicit Deny
wins), `*` and `?` wildcards in actions and resources, policy variables
(`${aws:PrincipalTag/...}`) in resources and condition values, and the condition operators
StringEquals / StringLike / ArnEquals / ArnLike / Bool / Null, their negations (StringNotEquals /
StringNotLike / ArnNotEquals / ArnNotLike: true when the key is absent), NumericLessThan and
their ForAllValues / ForAnyValue forms. Resource policies (the bucket's, the key's, the secret's, the endpoint's) are
read with their Effect and Principal: `allowed_by` and `denied_by` say whether one of their
statements applies to a principal's request; `bucket_denials` and the Sid readers give the bucket
policy's Deny statements to everyone as plain statements.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from functions.data.ledger_batches import LOCK_PK
from functions.training_job.images import DEBUGGER_RULE_ACCOUNTS, PYTORCH_TRAINING_ACCOUNTS
from retrain.local.cloudformation.template import Created, Resolver, Template, load_template
from tests.permissions import DENIALS, FUNCTION_PLACEHOLDERS, PERMISSIONS, Grant

ROOT = Path(__file__).resolve().parents[1]
# Actions no statement may grant on any resource: lifecycle, policy and ACL changes, wildcards.
FORBIDDEN_ACTIONS = (
    "*",
    "s3:*",
    "s3:PutLifecycleConfiguration",
    "s3:PutBucketPolicy",
    "s3:DeleteBucketPolicy",
    "s3:PutBucketAcl",
    "s3:PutObjectAcl",
    "s3:PutObjectVersionAcl",
    "iam:*",
    "kms:*",
    "dynamodb:*",
    "sagemaker:*",
)


@dataclass(frozen=True)
class Statement:
    actions: tuple[str, ...]
    resources: tuple[str, ...]
    conditions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    effect: str = "Allow"

    def condition_specs(self) -> frozenset[str]:
        """`Operator:key=v1,v2` for each condition (values sorted)."""
        return frozenset(
            f"{operator}:{key}={','.join(sorted(_values(value)))}"
            for operator, keys in self.conditions.items()
            for key, value in keys.items()
        )


@dataclass(frozen=True)
class Need:
    """One permission an AWS call needs: the action, the resource ARN, the request's condition context."""

    action: str
    resource: str
    context: Mapping[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        extra = f" {dict(self.context)}" if self.context else ""
        return f"{self.action} on {self.resource}{extra}"


# ---------------------------------------------------------------- template --
def template() -> Template:
    return load_template(ROOT / "template.yaml")


def principal_policies(body: Mapping[str, Any], logical_id: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The raw statements of a function's, state machine's, role's or managed policy's policies, and
    anything else granting permissions there (SAM policy templates, managed policy ARNs)."""
    resource = body["Resources"][logical_id]
    props = resource.get("Properties", {})
    statements: list[dict[str, Any]] = []
    others: list[str] = []
    kind = resource["Type"]
    if kind in {"AWS::Serverless::Function", "AWS::Serverless::StateMachine"}:
        for entry in props.get("Policies", []):
            if isinstance(entry, dict) and "Statement" in entry:
                statements += entry["Statement"]
            else:
                others.append(str(entry)[:80])
        role = own_role(body, logical_id)
        if role is not None:
            role_statements, role_others = principal_policies(body, role)
            statements += role_statements
            others += role_others
    elif kind == "AWS::IAM::Role":
        for policy in props.get("Policies", []):
            # A function's logs, traces and event source polling, checked on their own
            # (test_every_function_role_has_only_its_lambda_basics).
            if policy["PolicyName"] != LAMBDA_BASICS:
                statements += policy["PolicyDocument"]["Statement"]
        others += [str(arn) for arn in props.get("ManagedPolicyArns", [])]
    elif kind == "AWS::IAM::ManagedPolicy":
        statements += props["PolicyDocument"]["Statement"]
    else:
        raise AssertionError(f"{logical_id} is a {kind}, which holds no policies")
    return statements, others


LAMBDA_BASICS = "lambda-basics"


def own_role(body: Mapping[str, Any], logical_id: str) -> str | None:
    """The logical id of the role a function or state machine of the template runs as (every one
    names its own, `Role: !GetAtt <id>.Arn`), or None when SAM would make one."""
    role = body["Resources"][logical_id].get("Properties", {}).get("Role")
    if role is None:
        return None
    assert isinstance(role, dict) and "Fn::GetAtt" in role, f"{logical_id}: Role is not the template's: {role}"
    role_id, attribute = role["Fn::GetAtt"]
    assert attribute == "Arn" and body["Resources"][role_id]["Type"] == "AWS::IAM::Role", role
    return str(role_id)


def statements_of(body: Mapping[str, Any], logical_id: str, resolver: Resolver) -> list[Statement]:
    raw, others = principal_policies(body, logical_id)
    assert not others, f"{logical_id}: grants outside explicit statements: {others}"
    # Resolved as one list: a statement under `Fn::If` that resolves to AWS::NoValue is dropped.
    return [_statement(logical_id, resolved) for resolved in resolver.resolve(copy.deepcopy(raw))]


def _statement(where: str, resolved: Mapping[str, Any]) -> Statement:
    assert resolved.get("Effect") in {"Allow", "Deny"}, f"{where}: {resolved}"
    assert "NotAction" not in resolved and "NotResource" not in resolved, f"{where}: {resolved}"
    return Statement(
        actions=tuple(_values(resolved["Action"])),
        resources=tuple(_values(resolved["Resource"])),
        conditions=resolved.get("Condition", {}),
        effect=resolved["Effect"],
    )


def bucket_policy_denials(body: Mapping[str, Any], resolver: Resolver, sids: Iterable[str]) -> list[Statement]:
    """DataBucketPolicy's Deny statements named `sids` (each must be there, to everyone)."""
    document = resolver.resolve(copy.deepcopy(body["Resources"]["DataBucketPolicy"]["Properties"]["PolicyDocument"]))
    by_sid = {statement.get("Sid"): statement for statement in document["Statement"]}
    found = []
    for sid in sids:
        assert sid in by_sid, f"DataBucketPolicy has no statement {sid}"
        statement = by_sid[sid]
        assert statement["Effect"] == "Deny" and statement.get("Principal") == "*", f"{sid}: {statement}"
        found.append(_statement(f"DataBucketPolicy.{sid}", statement))
    return found


def bucket_denials(body: Mapping[str, Any], logical_id: str, resolver: Resolver) -> list[Statement]:
    """The Deny statements a bucket policy applies to every principal (its only kind of Deny)."""
    document = body["Resources"][logical_id]["Properties"]["PolicyDocument"]
    found = []
    for resolved in resolver.resolve(copy.deepcopy(document["Statement"])):
        if resolved["Effect"] != "Deny":
            continue
        assert resolved.get("Principal") == "*", f"{logical_id}: only Deny to every principal is modelled: {resolved}"
        assert "NotAction" not in resolved and "NotResource" not in resolved, f"{logical_id}: {resolved}"
        found.append(
            Statement(
                actions=tuple(_values(resolved["Action"])),
                resources=tuple(_values(resolved["Resource"])),
                conditions=resolved.get("Condition", {}),
                effect="Deny",
            )
        )
    return found


def _values(value: Any) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else [str(value)]


# ------------------------------------------------------ a resolver with fakes --
REGION, ACCOUNT, STACK = "eu-west-1", "111122223333", "retrain-test"
FAKE_PARAMETERS = {
    "TrainingVpcId": "vpc-0fake",
    "TrainingSubnetIds": "subnet-0aaa,subnet-0bbb",
    "TrainingSecurityGroupIds": "",
    "PrivateRouteTableIds": "",
    "S3PrefixListId": "pl-0fake0000",
    "ExistingFileSystemId": "",
    "AnnotationTeams": "munich,berlin",
}


class _Attributes(dict[str, str]):
    """Any attribute of a fake resource: `<logical id>.<attribute>` unless set."""

    def __init__(self, logical_id: str, known: dict[str, str]) -> None:
        super().__init__(known)
        self._logical_id = logical_id

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: str) -> str:
        return f"{self._logical_id}.{key}"


def _fake(logical_id: str, kind: str) -> Created:
    name = f"{STACK}-{logical_id}"
    prefix = f"arn:aws:{{}}:{REGION}:{ACCOUNT}:"
    known: dict[str, tuple[str, dict[str, str]]] = {
        "AWS::S3::Bucket": (name.lower(), {"Arn": f"arn:aws:s3:::{name.lower()}"}),
        "AWS::DynamoDB::Table": (name, {"Arn": prefix.format("dynamodb") + f"table/{name}"}),
        "AWS::Serverless::Function": (name, {"Arn": prefix.format("lambda") + f"function:{name}"}),
        "AWS::IAM::Role": (name, {"Arn": f"arn:aws:iam::{ACCOUNT}:role/{name}"}),
        "AWS::IAM::ManagedPolicy": (f"arn:aws:iam::{ACCOUNT}:policy/{name}", {}),
        "AWS::KMS::Key": ("key-0fake", {"Arn": prefix.format("kms") + "key/key-0fake"}),
        "AWS::SNS::Topic": (prefix.format("sns") + name, {"TopicName": name}),
        "AWS::SecretsManager::Secret": (prefix.format("secretsmanager") + f"secret:{name}-AbCdEf", {}),
        "AWS::FSx::FileSystem": ("fs-0fake0000000000", {"LustreMountName": "abcdefgh"}),
        "AWS::EC2::SecurityGroup": ("sg-0fake", {"GroupId": "sg-0fake"}),
        "AWS::SageMaker::ModelPackageGroup": (
            prefix.format("sagemaker") + f"model-package-group/{STACK}-segmentation",
            {"ModelPackageGroupArn": prefix.format("sagemaker") + f"model-package-group/{STACK}-segmentation"},
        ),
        "AWS::Serverless::StateMachine": (prefix.format("states") + f"stateMachine:{STACK}-retrain", {}),
        "AWS::Logs::LogGroup": (name, {"Arn": prefix.format("logs") + f"log-group:{name}:*"}),
        "AWS::Backup::BackupVault": (name, {"BackupVaultArn": prefix.format("backup") + f"backup-vault:{name}"}),
        "AWS::Events::Rule": (name, {"Arn": prefix.format("events") + f"rule/{name}"}),
    }
    ref, attributes = known.get(kind, (name, {}))
    return Created(ref=ref, attributes=_Attributes(logical_id, {"Arn": f"arn:fake:{logical_id}", **attributes}))


def fake_resolver(body: Mapping[str, Any], **parameters: str) -> Resolver:
    """Resolves the template as if deployed as `retrain-test`, every resource faked."""
    specs = body.get("Parameters", {})
    values = {name: str(spec["Default"]) for name, spec in specs.items() if "Default" in spec}
    values.update(FAKE_PARAMETERS)
    values.update(parameters)
    lists = frozenset(name for name, spec in specs.items() if str(spec.get("Type", "")).startswith(("List<", "Comma")))
    resolver = Resolver(
        STACK,
        REGION,
        ACCOUNT,
        values,
        list_parameters=lists,
        condition_definitions=body.get("Conditions", {}),
        mappings=body.get("Mappings", {}),
    )
    for logical_id, resource in body["Resources"].items():
        resolver.created[logical_id] = _fake(logical_id, resource["Type"])
        name = resource.get("Properties", {}).get("RoleName")
        if resource["Type"] == "AWS::IAM::Role" and name is not None:
            role = str(resolver.resolve(copy.deepcopy(name)))
            resolver.created[logical_id] = Created(
                ref=role, attributes=_Attributes(logical_id, {"Arn": f"arn:aws:iam::{ACCOUNT}:role/{role}"})
            )
    return resolver


# ------------------------------------------------------------ declarations --
def stack_uuid_prefix(resolver: Resolver) -> str:
    stack_id = resolver.pseudo("AWS::StackId")
    return str(uuid.UUID(stack_id.rsplit("/", 1)[-1])).split("-")[0]


def placeholders(body: Mapping[str, Any], resolver: Resolver) -> dict[str, str]:
    """What the declarations' placeholders stand for in this resolved template."""
    region, account, stack = resolver.region, resolver.account_id, resolver.stack_name

    def att(logical_id: str, attribute: str) -> str:
        return str(resolver.resolve({"Fn::GetAtt": [logical_id, attribute]}))

    def ref(logical_id: str) -> str:
        return str(resolver.resolve({"Ref": logical_id}))

    file_system = resolver.resolve(
        {"Fn::If": ["CreateFileSystem", {"Ref": "DatasetFileSystem"}, {"Ref": "ExistingFileSystemId"}]}
    )
    names = {
        "partition": "aws",
        "region": region,
        "account": account,
        "bucket": f"arn:aws:s3:::{ref('DataBucket')}",
        "ledger": att("LedgerTable", "Arn"),
        "idempotency": att("IdempotencyTable", "Arn"),
        "intake_queue": att("IntakeQueue", "Arn"),
        "key": att("DataKey", "Arn"),
        "topic": ref("NotificationTopic"),
        "secret": ref("SlackWebhookSecret"),
        "state_machine": f"arn:aws:states:{region}:{account}:stateMachine:{stack}-retrain",
        "executions": f"arn:aws:states:{region}:{account}:execution:{stack}-retrain:*",
        "jobs": f"arn:aws:sagemaker:{region}:{account}:training-job/retrain-{stack_uuid_prefix(resolver)}-*",
        "model_package_group": att("ModelPackageGroup", "ModelPackageGroupArn"),
        "model_packages": f"arn:aws:sagemaker:{region}:{account}:model-package/{stack}-segmentation/*",
        "file_system": f"arn:aws:fsx:{region}:{account}:file-system/{file_system}",
        "fsx_tasks": f"arn:aws:fsx:{region}:{account}:task/*",
        "training_role": att("TrainingRole", "Arn"),
        "report_reader_role": att("ReportReaderRole", "Arn"),
        # Only with LedgerBackupRetentionDays > 0: an offline stack without a plan has no vault.
        "ledger_backup_vault": (
            att("LedgerBackupVault", "BackupVaultArn") if "LedgerBackupVault" in resolver.created else ""
        ),
        "lock": LOCK_PK,
        "run_ended_failures": att("RunEndedFailureQueue", "Arn"),
    }
    for logical_id, placeholder in FUNCTION_PLACEHOLDERS.items():
        names[placeholder] = att(logical_id, "Arn")
    names["stack_name"] = stack
    names["pytorch_registry"] = PYTORCH_TRAINING_ACCOUNTS[region]
    names["debugger_rules_registry"] = DEBUGGER_RULE_ACCOUNTS.get(region, PYTORCH_TRAINING_ACCOUNTS[region])
    return names


Pairs = dict[tuple[str, str], list[frozenset[str]]]


def declared_pairs(grants: Iterable[Grant], names: Mapping[str, str]) -> Pairs:
    """(action, resource) -> the condition specs of each grant giving it."""
    found: Pairs = {}
    for grant in grants:
        specs = frozenset(spec.format(**names) for spec in grant.conditions)
        for action in grant.actions:
            for resource in grant.resources:
                found.setdefault((action, resource.format(**names)), []).append(specs)
    return found


def granted_pairs(statements: Iterable[Statement], effect: str = "Allow") -> Pairs:
    found: Pairs = {}
    for statement in statements:
        if statement.effect != effect:
            continue
        for action in statement.actions:
            for resource in statement.resources:
                found.setdefault((action, resource), []).append(statement.condition_specs())
    return found


def _spec_matches(declared: frozenset[str], granted: frozenset[str]) -> bool:
    """Declared `Op:key` matches any value of that condition; `Op:key=value` that value."""
    if len(declared) != len(granted):
        return False
    return all(any(g == d or g.startswith(f"{d}=") for g in granted) for d in declared)


def differences(declared: Pairs, granted: Pairs, who: str, effect: str = "Allow") -> list[str]:
    """What the template grants (or denies) beyond the declaration, and what it lacks, one line each."""
    problems = []
    gives, lacks = ("grants", "lacks") if effect == "Allow" else ("denies", "lacks the Deny of")
    for action, resource in sorted(granted.keys() - declared.keys()):
        problems.append(f"{who}: {gives} {action} on {resource}, which tests/permissions.py does not declare")
    for action, resource in sorted(declared.keys() - granted.keys()):
        problems.append(f"{who}: {lacks} {action} on {resource}, which tests/permissions.py declares")
    for pair in sorted(declared.keys() & granted.keys()):
        problems.extend(
            f"{who}: {pair[0]} on {pair[1]} lacks the conditions {sorted(specs)}"
            for specs in declared[pair]
            if not any(_spec_matches(specs, g) for g in granted[pair])
        )
        problems.extend(
            f"{who}: {pair[0]} on {pair[1]} has undeclared conditions {sorted(g)}"
            for g in granted[pair]
            if not any(_spec_matches(d, g) for d in declared[pair])
        )
    return problems


def check_template(body: Mapping[str, Any], resolver: Resolver) -> list[str]:
    """Every principal's grants against its declaration; an empty list when they agree."""
    names = placeholders(body, resolver)
    problems = []
    for logical_id, grants in PERMISSIONS.items():
        statements = statements_of(body, logical_id, resolver)
        problems += differences(declared_pairs(grants, names), granted_pairs(statements), logical_id)
        denied = granted_pairs(statements, "Deny")
        problems += differences(declared_pairs(DENIALS.get(logical_id, ()), names), denied, logical_id, "Deny")
    return problems


def forbidden_grants(body: Mapping[str, Any]) -> list[str]:
    """Statements anywhere in the template that grant a forbidden action."""
    found = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if node.get("Effect") == "Allow" and "Action" in node:
                found.extend(
                    f"{where}: {action}"
                    for action in _values(node["Action"])
                    if any(fnmatch.fnmatchcase(forbidden.lower(), action.lower()) for forbidden in FORBIDDEN_ACTIONS)
                )
            for key, value in node.items():
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{where}[{index}]")

    # The key policy too: it names who administers and who uses the key, never kms:* (the
    # bucket policy's s3:* is a Deny).
    for logical_id, resource in body["Resources"].items():
        walk(resource.get("Properties", {}), logical_id)
    return found


# ------------------------------------------------------------------ matcher --
def matches(pattern: str, value: str, *, case: bool = True) -> bool:
    """IAM's wildcard match: `*` any run of characters, `?` one."""
    regex = re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".")
    return re.fullmatch(regex, value, 0 if case else re.IGNORECASE) is not None


_POLICY_VARIABLE = re.compile(r"\$\{([^}]+)\}")
_NEGATED = {
    "StringNotEquals": "StringEquals",
    "StringNotLike": "StringLike",
    "ArnNotEquals": "ArnEquals",
    "ArnNotLike": "ArnLike",
}


def substitute(pattern: str, context: Mapping[str, Any]) -> str | None:
    """`pattern` with its policy variables filled from the request; None when one has no value
    (IAM then matches nothing with it)."""
    missing = [name for name in _POLICY_VARIABLE.findall(pattern) if name not in context]
    if missing:
        return None
    return _POLICY_VARIABLE.sub(lambda match: str(context[match.group(1)]), pattern)


def _condition_holds(operator: str, key: str, expected: Any, context: Mapping[str, Any]) -> bool:
    quantifier, _, base = operator.rpartition(":")
    if_exists = base.endswith("IfExists")
    base = base.removesuffix("IfExists")
    wanted = [value for value in (substitute(w, context) for w in _values(expected)) if value is not None]
    if base == "Null":
        return (key not in context) == (wanted[0].lower() == "true")
    negated = base in _NEGATED
    base = _NEGATED.get(base, base)
    if key not in context:
        # A negated operator holds for a key the request lacks (nothing there equals the values).
        return negated or quantifier == "ForAllValues" or if_exists
    present = context[key]
    values = [str(v) for v in present] if isinstance(present, list) else [str(present)]

    def one(value: str) -> bool:
        if base == "StringEquals":
            return value in wanted
        # IAM's ArnEquals takes wildcards as ArnLike does: only a value without one is exact.
        if base in {"StringLike", "ArnLike", "ArnEquals"}:
            return any(matches(w, value) for w in wanted)
        if base == "Bool":
            return value.lower() in {w.lower() for w in wanted}
        if base == "NumericLessThan":
            return any(float(value) < float(w) for w in wanted)
        raise AssertionError(f"condition operator {operator} is not modelled")

    if quantifier == "ForAllValues":
        held = all(one(v) for v in values)
    elif quantifier == "ForAnyValue":
        held = any(one(v) for v in values)
    else:
        held = len(values) == 1 and one(values[0])
    return not held if negated else held


def allows(statement: Statement, need: Need) -> bool:
    """The statement applies to `need`: an Allow allows it, a Deny denies it."""
    if not any(matches(a, need.action, case=False) for a in statement.actions):
        return False
    resources = [substitute(r, need.context) for r in statement.resources]
    if not any(r is not None and matches(r, need.resource) for r in resources):
        return False
    return all(
        _condition_holds(operator, key, expected, need.context)
        for operator, keys in statement.conditions.items()
        for key, expected in keys.items()
    )


def allowed(statements: Iterable[Statement], need: Need) -> bool:
    """Some Allow statement applies to `need`, and no Deny statement does."""
    statements = list(statements)
    return any(s.effect == "Allow" and allows(s, need) for s in statements) and not denied(statements, need)


def denied(statements: Iterable[Statement], need: Need) -> bool:
    return any(s.effect == "Deny" and allows(s, need) for s in statements)


# --------------------------------------------------------- resource policies --
@dataclass(frozen=True)
class ResourceStatement:
    effect: str
    principal: Any  # "*", or {"AWS": ARN(s)} / {"Service": name(s)}
    statement: Statement


def resource_policy(document: Mapping[str, Any]) -> list[ResourceStatement]:
    """A resolved resource policy's statements (a bucket's, a key's, a secret's, an endpoint's)."""
    found = []
    for raw in document["Statement"]:
        assert "NotAction" not in raw and "NotResource" not in raw and "NotPrincipal" not in raw, raw
        found.append(
            ResourceStatement(
                effect=raw["Effect"],
                principal=raw.get("Principal", "*"),
                statement=Statement(
                    actions=tuple(_values(raw["Action"])),
                    resources=tuple(_values(raw["Resource"])),
                    conditions=raw.get("Condition", {}),
                ),
            )
        )
    return found


def _names_principal(principal: Any, arn: str) -> bool:
    """Whether a statement's Principal covers `arn` (an IAM ARN, or a service's name). The
    account root stands for every principal of the account, as far as IAM lets it."""
    if principal == "*":
        return True
    for kind, names in principal.items():
        for name in _values(names):
            if name == "*" or name == arn:
                return True
            if kind == "AWS" and name.endswith(":root") and arn.startswith(name.removesuffix("root")):
                return True
    return False


def _with_principal(need: Need, principal: str) -> Need:
    return Need(need.action, need.resource, {"aws:PrincipalArn": principal, **need.context})


def allowed_by(policy: Iterable[ResourceStatement], principal: str, need: Need) -> bool:
    """An Allow statement of the policy applies to `principal`'s request (and no Deny does)."""
    request = _with_principal(need, principal)
    applies = [s for s in policy if _names_principal(s.principal, principal) and allows(s.statement, request)]
    return any(s.effect == "Allow" for s in applies) and not any(s.effect == "Deny" for s in applies)


def denied_by(policy: Iterable[ResourceStatement], principal: str, need: Need) -> bool:
    """A Deny statement of the policy applies to `principal`'s request."""
    request = _with_principal(need, principal)
    return any(
        s.effect == "Deny" and _names_principal(s.principal, principal) and allows(s.statement, request) for s in policy
    )


@functools.cache
def role_arn(logical_id: str) -> str:
    """The ARN of the role a function, state machine or role of the template acts as, deployed as
    `retrain-test`: the role's RoleName, which every role of the template gives."""
    body = template().body
    role = own_role(body, logical_id) or logical_id
    props = body["Resources"][role]["Properties"]
    assert "RoleName" in props, f"{role} has no RoleName: CloudFormation would make up its name"
    return str(fake_resolver(body).resolve({"Fn::GetAtt": [role, "Arn"]}))
