"""What AWS services check on their side and botocore's client-side validator does not: enum
values, maximum lengths, counts and values, and patterns of a request against a service model.

Shared by the training-job builder (which checks its requests before they leave) and the offline
stack's emulators (which refuse what AWS would).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from botocore.model import ListShape, MapShape, Shape, StringShape, StructureShape

# Java character classes in botocore's patterns, and their Python equivalents.
_JAVA_CLASSES = {r"\p{L}": r"\w", r"\p{Z}": r"\s", r"\p{N}": r"\d", r"\p{Alnum}": "a-zA-Z0-9"}


def service_side_problems(value: Any, shape: Shape, path: str = "") -> list[str]:
    """Constraint violations botocore's client-side validator leaves to the service."""
    if isinstance(shape, StructureShape) and isinstance(value, Mapping):
        return [
            problem
            for name, member in shape.members.items()
            if name in value
            for problem in service_side_problems(value[name], member, f"{path}.{name}")
        ]
    problems = _size_problems(value, shape, path.lstrip(".") or "input")
    if isinstance(shape, ListShape) and isinstance(value, list):
        for index, item in enumerate(value):
            problems += service_side_problems(item, shape.member, f"{path}[{index}]")
    elif isinstance(shape, MapShape) and isinstance(value, Mapping):
        for key, item in value.items():
            problems += service_side_problems(key, shape.key, f"{path} key {key!r}")
            problems += service_side_problems(item, shape.value, f"{path}.{key}")
    elif isinstance(shape, StringShape) and isinstance(value, str):
        if shape.enum and value not in shape.enum:
            problems.append(f"{path.lstrip('.')}: {value!r} is not one of {', '.join(shape.enum)}")
        pattern = shape.metadata.get("pattern")
        if pattern and not _matches(pattern, value):
            problems.append(f"{path.lstrip('.')}: {value!r} does not match {pattern}")
    return problems


def _size_problems(value: Any, shape: Shape, where: str) -> list[str]:
    """Maxima: characters of a string, entries of a list or map, value of a number."""
    maximum = shape.metadata.get("max")
    if maximum is None or isinstance(value, bool):
        return []
    if isinstance(value, str) and len(value) > maximum:
        return [f"{where}: {len(value)} characters, at most {maximum} allowed"]
    if isinstance(value, list | Mapping) and len(value) > maximum:
        return [f"{where}: {len(value)} entries, at most {maximum} allowed"]
    if isinstance(value, int) and value > maximum:
        return [f"{where}: {value} is above the maximum {maximum}"]
    return []


def _matches(pattern: str, value: str) -> bool:
    for java, python in _JAVA_CLASSES.items():
        pattern = pattern.replace(java, python)
    try:
        # DOTALL off, as in Java: `.*` does not cross a newline there either.
        return re.fullmatch(pattern, value) is not None
    except re.error:
        return True  # a construct Python lacks: leave this one to the service, as botocore does
