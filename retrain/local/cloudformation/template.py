"""Read `template.yaml` and resolve its intrinsic functions for the offline stack.

The offline stack creates what the template declares, from the template itself, so the two
cannot drift. This is a small CloudFormation: short-form tags are read into their long form,
resources are ordered by their references, and Ref / Fn::GetAtt / Fn::Sub / Fn::Join / Fn::Select /
Fn::Split / Fn::FindInMap resolve against what has been created so far (and the Mappings section).
Conditions (Fn::Equals / Not / And / Or), Fn::If, AWS::NoValue and the Rules section's assertions
are evaluated as CloudFormation does, so a resource whose condition is false is not created.
Anything else fails loudly, naming the function.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Any

import yaml

from functions.common.errors import RetrainError


class TemplateError(RetrainError):
    """The template cannot be read or resolved for the offline stack."""


class _CfnLoader(yaml.SafeLoader):
    """YAML loader that turns CloudFormation's short-form tags into their long form."""


def _construct_tag(loader: yaml.SafeLoader, tag_suffix: str, node: yaml.Node) -> dict[str, Any]:
    # `!Ref` and `!Condition` are the long forms `Ref` and `Condition`; every other tag is `Fn::<tag>`.
    name = tag_suffix if tag_suffix in {"Ref", "Condition"} else f"Fn::{tag_suffix}"
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
        if tag_suffix == "GetAtt":
            value = str(value).split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    return {name: value}


_CfnLoader.add_multi_constructor("!", _construct_tag)

PSEUDO_PARAMETERS = ("AWS::AccountId", "AWS::Region", "AWS::StackName", "AWS::Partition")
# What `Ref: AWS::NoValue` resolves to: the property (or list item) holding it is dropped.
NO_VALUE = object()
_SUB_VARIABLE = re.compile(r"\$\{([^}!][^}]*)\}")


@dataclass
class Template:
    path: Path
    body: dict[str, Any]

    @property
    def resources(self) -> dict[str, dict[str, Any]]:
        resources: dict[str, dict[str, Any]] = self.body.get("Resources", {})
        return resources

    @property
    def parameters(self) -> dict[str, dict[str, Any]]:
        parameters: dict[str, dict[str, Any]] = self.body.get("Parameters", {})
        return parameters

    @property
    def conditions(self) -> dict[str, Any]:
        conditions: dict[str, Any] = self.body.get("Conditions", {})
        return conditions

    @property
    def mappings(self) -> dict[str, dict[str, dict[str, Any]]]:
        mappings: dict[str, dict[str, dict[str, Any]]] = self.body.get("Mappings", {})
        return mappings

    @property
    def rules(self) -> dict[str, dict[str, Any]]:
        rules: dict[str, dict[str, Any]] = self.body.get("Rules", {})
        return rules

    @property
    def function_globals(self) -> dict[str, Any]:
        globals_: dict[str, Any] = self.body.get("Globals", {}).get("Function", {})
        return globals_

    def resources_of_type(self, resource_type: str) -> dict[str, dict[str, Any]]:
        return {
            logical_id: resource
            for logical_id, resource in self.resources.items()
            if resource.get("Type") == resource_type
        }

    def creation_order(self) -> list[str]:
        """Logical ids ordered so that every resource comes after the ones it references."""
        graph = {
            logical_id: references(resource, self.resources.keys()) for logical_id, resource in self.resources.items()
        }
        # A function also depends on what the template's Globals section references.
        global_references = references(self.function_globals, self.resources.keys())
        for logical_id in self.resources_of_type("AWS::Serverless::Function"):
            graph[logical_id] |= global_references
        try:
            return list(TopologicalSorter(graph).static_order())
        except CycleError as exc:
            raise TemplateError(f"resources reference each other in a cycle: {exc.args[1]}") from exc


def load_template(path: Path) -> Template:
    try:
        body = yaml.load(path.read_text(encoding="utf-8"), Loader=_CfnLoader)  # noqa: S506 (a SafeLoader subclass)
    except (OSError, yaml.YAMLError) as exc:
        raise TemplateError(f"cannot read {path}: {exc}") from exc
    if not isinstance(body, dict) or not isinstance(body.get("Resources"), dict):
        raise TemplateError(f"{path} has no Resources section")
    return Template(path=path, body=body)


def references(node: Any, logical_ids: Any) -> set[str]:
    """Logical ids that `node` (a resource, or any part of one) depends on."""
    known = set(logical_ids)
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                if key == "Ref" and isinstance(inner, str):
                    found.add(inner)
                elif key == "Fn::GetAtt":
                    target = inner[0] if isinstance(inner, list) else str(inner).split(".", 1)[0]
                    found.add(target)
                elif key == "Fn::Sub":
                    text = inner[0] if isinstance(inner, list) else inner
                    found.update(name.split(".", 1)[0] for name in _SUB_VARIABLE.findall(text))
                    walk(inner[1] if isinstance(inner, list) else None)
                elif key == "DependsOn":
                    found.update([inner] if isinstance(inner, str) else inner)
                else:
                    walk(inner)
        elif isinstance(value, list):
            for inner in value:
                walk(inner)

    walk(node)
    return found & known


@dataclass
class Created:
    """What a created resource answers to `Ref` and `Fn::GetAtt`."""

    ref: str
    attributes: dict[str, str] = field(default_factory=dict)


@dataclass
class Resolver:
    """Resolves intrinsic functions against parameters and the resources created so far."""

    stack_name: str
    region: str
    account_id: str
    parameters: Mapping[str, str]
    created: dict[str, Created] = field(default_factory=dict)
    # Parameters of a `List<...>` or `CommaDelimitedList` type: Ref gives a list, as on AWS.
    list_parameters: frozenset[str] = frozenset()
    # The template's Conditions section, evaluated on first use (see `condition`).
    condition_definitions: Mapping[str, Any] = field(default_factory=dict)
    # The template's Mappings section, for Fn::FindInMap.
    mappings: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    _condition_values: dict[str, bool] = field(default_factory=dict, init=False)

    def pseudo(self, name: str) -> str:
        return {
            "AWS::AccountId": self.account_id,
            "AWS::Region": self.region,
            "AWS::StackName": self.stack_name,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
            # Like AWS's: one UUID per stack (the same for the same name offline).
            "AWS::StackId": (
                f"arn:aws:cloudformation:{self.region}:{self.account_id}:stack/{self.stack_name}/"
                f"{uuid.uuid5(uuid.NAMESPACE_URL, self.stack_name)}"
            ),
        }[name]

    def ref(self, name: str) -> Any:
        if name == "AWS::NoValue":
            return NO_VALUE
        if name in self.list_parameters:
            return [item.strip() for item in str(self.parameters[name]).split(",") if item.strip()]
        if name in self.parameters:
            return str(self.parameters[name])
        if name.startswith("AWS::"):
            return self.pseudo(name)
        if name in self.created:
            return self.created[name].ref
        raise TemplateError(f"Ref to {name!r}, which is neither a parameter nor created yet")

    def get_att(self, logical_id: str, attribute: str) -> str:
        created = self.created.get(logical_id)
        if created is None or attribute not in created.attributes:
            raise TemplateError(f"Fn::GetAtt {logical_id}.{attribute} is not known offline")
        return created.attributes[attribute]

    def resolve(self, node: Any) -> Any:
        if isinstance(node, list):
            return [item for item in (self.resolve(item) for item in node) if item is not NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            ((key, value),) = node.items()
            function = self._functions().get(key)
            # {"Condition": name} is a condition function; a Condition block of a policy is a map.
            if function is not None and not (key == "Condition" and not isinstance(value, str)):
                return function(value)
            if key.startswith("Fn::"):
                raise TemplateError(f"{key} is not supported by the offline stack")
        resolved = {key: self.resolve(value) for key, value in node.items()}
        return {key: value for key, value in resolved.items() if value is not NO_VALUE}

    def condition(self, name: str) -> bool:
        """The value of the template condition `name`, as CloudFormation evaluates it."""
        if name not in self._condition_values:
            if name not in self.condition_definitions:
                raise TemplateError(f"condition {name!r} is not defined in the template's Conditions")
            value = self.resolve(self.condition_definitions[name])
            if not isinstance(value, bool):
                raise TemplateError(f"condition {name!r} is not a condition function (Fn::Equals, Not, And, Or)")
            self._condition_values[name] = value
        return self._condition_values[name]

    def check_rules(self, rules: Mapping[str, Mapping[str, Any]]) -> None:
        """Raise the first failing assertion of the template's Rules, as CloudFormation refuses the stack."""
        for name, rule in rules.items():
            if "RuleCondition" in rule and not self.resolve(rule["RuleCondition"]):
                continue
            for assertion in rule.get("Assertions", []):
                if not self.resolve(assertion["Assert"]):
                    reason = assertion.get("AssertDescription", "its assertion is false")
                    raise TemplateError(f"template rule {name}: {reason}")

    def _functions(self) -> dict[str, Callable[[Any], Any]]:
        return {
            "Ref": self.ref,
            "Fn::GetAtt": self._get_att,
            "Fn::Sub": self._sub,
            "Fn::Join": self._join,
            "Fn::Select": self._select,
            "Fn::Split": self._split,
            "Fn::FindInMap": self._find_in_map,
            "Fn::If": self._if,
            "Fn::Equals": self._equals,
            "Fn::Not": lambda value: not self._boolean(value[0]),
            "Fn::And": lambda value: all(self._boolean(item) for item in value),
            "Fn::Or": lambda value: any(self._boolean(item) for item in value),
            "Condition": self.condition,
        }

    def _if(self, value: Any) -> Any:
        name, when_true, when_false = value
        return self.resolve(when_true if self.condition(name) else when_false)

    def _equals(self, value: Any) -> bool:
        left, right = (self.resolve(item) for item in value)
        return bool(str(left) == str(right))

    def _boolean(self, node: Any) -> bool:
        value = self.resolve(node)
        if not isinstance(value, bool):
            raise TemplateError(f"{node!r} is not a condition")
        return value

    def _get_att(self, value: Any) -> str:
        logical_id, attribute = value if isinstance(value, list) else value.split(".", 1)
        return self.get_att(logical_id, attribute)

    def _join(self, value: Any) -> str:
        separator, items = value
        return str(separator).join(str(item) for item in self.resolve(items))

    def _select(self, value: Any) -> Any:
        index, items = value
        return self.resolve(items)[int(self.resolve(index))]

    def _find_in_map(self, value: Any) -> Any:
        name, top, second = (str(self.resolve(item)) for item in value)
        try:
            return self.mappings[name][top][second]
        except KeyError:
            # As CloudFormation refuses the stack: a region (or key) the map does not list.
            raise TemplateError(f"Fn::FindInMap: the mapping {name} has no {top}.{second}") from None

    def _split(self, value: Any) -> list[str]:
        separator, text = value
        return str(self.resolve(text)).split(str(separator))

    def _sub(self, value: Any) -> str:
        if isinstance(value, list):
            text, variables = value[0], self.resolve(value[1])
        else:
            text, variables = value, {}

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in variables:
                return str(variables[name])
            if "." in name and not name.startswith("AWS::"):
                logical_id, attribute = name.split(".", 1)
                return self.get_att(logical_id, attribute)
            return str(self.ref(name))

        # `${!Name}` is CloudFormation's escape for a literal `${Name}` (an IAM policy variable).
        return _SUB_VARIABLE.sub(substitute, str(text)).replace("${!", "${")
