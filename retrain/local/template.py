"""Read `template.yaml` and resolve its intrinsic functions for the offline stack.

The offline stack creates what the template declares, from the template itself, so the two
cannot drift. This is a small CloudFormation: short-form tags are read into their long form,
resources are ordered by their references, and Ref / Fn::GetAtt / Fn::Sub / Fn::Join / Fn::Select
resolve against what has been created so far. Anything else fails loudly, naming the function.
"""

from __future__ import annotations

import re
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
    name = "Ref" if tag_suffix == "Ref" else f"Fn::{tag_suffix}"
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

    def pseudo(self, name: str) -> str:
        return {
            "AWS::AccountId": self.account_id,
            "AWS::Region": self.region,
            "AWS::StackName": self.stack_name,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
        }[name]

    def ref(self, name: str) -> Any:
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
            return [self.resolve(item) for item in node]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            ((key, value),) = node.items()
            function = self._functions().get(key)
            if function is not None:
                return function(value)
            if key.startswith("Fn::") or key == "Condition":
                raise TemplateError(f"{key} is not supported by the offline stack")
        return {key: self.resolve(value) for key, value in node.items()}

    def _functions(self) -> dict[str, Callable[[Any], Any]]:
        return {
            "Ref": self.ref,
            "Fn::GetAtt": self._get_att,
            "Fn::Sub": self._sub,
            "Fn::Join": self._join,
            "Fn::Select": self._select,
        }

    def _get_att(self, value: Any) -> str:
        logical_id, attribute = value if isinstance(value, list) else value.split(".", 1)
        return self.get_att(logical_id, attribute)

    def _join(self, value: Any) -> str:
        separator, items = value
        return str(separator).join(str(item) for item in self.resolve(items))

    def _select(self, value: Any) -> Any:
        index, items = value
        return self.resolve(items)[int(self.resolve(index))]

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

        return _SUB_VARIABLE.sub(substitute, str(text))
