"""samconfig.toml.example deploys what template.yaml declares: every override names a real
parameter, every parameter without a Default is set, and sam reads each entry as one Key=Value.

A user copies the example to samconfig.toml and runs `make deploy` (docs/deploy.md): a misspelt
or removed parameter there would fail only at `sam deploy`, against an AWS account.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

from retrain.local.cloudformation.template import load_template
from tests.unit.test_role_names import MAX_STACK_NAME_LENGTH

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "samconfig.toml.example"


def example() -> dict[str, Any]:
    with EXAMPLE.open("rb") as file:
        return tomllib.load(file)


def overrides(value: str | list[str]) -> dict[str, str]:
    """sam's shorthand: space-separated Key=Value pairs (a value with spaces quoted), as one
    string or a list of them. Each list entry must be exactly one pair: sam would cut an
    unquoted value at its first space."""
    pairs: dict[str, str] = {}
    for entry in [value] if isinstance(value, str) else value:
        tokens = shlex.split(entry)
        assert isinstance(value, str) or len(tokens) == 1, f"{entry!r} is not one Key=Value: quote its value"
        for token in tokens:
            key, separator, setting = token.partition("=")
            assert separator and key, f"{token!r} in parameter_overrides is not Key=Value"
            assert key not in pairs, f"{key} is set twice in parameter_overrides"
            pairs[key] = setting
    return pairs


def deploy_overrides() -> dict[str, str]:
    return overrides(example()["default"]["deploy"]["parameters"]["parameter_overrides"])


def template_parameters() -> dict[str, dict[str, Any]]:
    return load_template(ROOT / "template.yaml").parameters


def test_every_override_is_a_template_parameter() -> None:
    unknown = set(deploy_overrides()) - set(template_parameters())
    assert unknown == set(), f"samconfig.toml.example sets parameters template.yaml does not declare: {unknown}"


def test_every_parameter_without_a_default_is_set() -> None:
    required = {name for name, parameter in template_parameters().items() if "Default" not in parameter}
    assert required, "template.yaml has no required parameter: is this the right template?"
    missing = required - {name for name, value in deploy_overrides().items() if value}
    assert missing == set(), f"samconfig.toml.example leaves required parameters unset: {missing}"


def test_the_security_group_rule_is_satisfied() -> None:
    # A rule, not a missing Default: with no groups of one's own, the stack needs S3's prefix list.
    settings = deploy_overrides()
    assert settings.get("TrainingSecurityGroupIds") or settings.get("S3PrefixListId")


def test_values_keep_to_the_parameters_patterns_and_allowed_values() -> None:
    parameters = template_parameters()
    for name, value in deploy_overrides().items():
        parameter = parameters[name]
        if "AllowedValues" in parameter:
            assert value in [str(allowed) for allowed in parameter["AllowedValues"]], name
        if "AllowedPattern" in parameter:
            assert re.fullmatch(parameter["AllowedPattern"], value), f"{name}={value!r}"


def test_what_sam_and_make_deploy_read() -> None:
    config = example()
    assert config["version"] == 0.1
    deploy = config["default"]["deploy"]["parameters"]
    # Every role is named (resource policies name them exactly): CAPABILITY_NAMED_IAM.
    assert deploy["capabilities"] == "CAPABILITY_NAMED_IAM"
    assert deploy["resolve_s3"] is True
    assert isinstance(deploy["confirm_changeset"], bool)
    # `make deploy` reads the stack name (and region) from here to release the trainer afterwards.
    assert config["default"]["global"]["parameters"]["stack_name"]
    assert config["default"]["global"]["parameters"]["region"]
    # The same build `make sam-build` runs: without it sam copies .venv into every function.
    assert config["default"]["build"]["parameters"]["build_in_source"] is True


def test_the_example_names_the_operators_and_a_stack_name_the_role_names_fit() -> None:
    """The template refuses empty operator lists (rule OperatorsAreNamed) and names every role
    `<stack>-<name>`: the example's stack name must leave room for the longest."""
    settings = deploy_overrides()
    for name in ("TrainerReleasers", "ErasureOperatorArns", "KeyAdministratorArns"):
        assert settings.get(name) or settings.get("OpenOperatorAccess") == "true", name
    stack = example()["default"]["global"]["parameters"]["stack_name"]
    assert len(stack) <= MAX_STACK_NAME_LENGTH


def test_make_deploy_refuses_the_stack_names_cloudformation_would_fail_on() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert f"MAX_STACK_NAME := {MAX_STACK_NAME_LENGTH}" in makefile
