"""Renders the state machine's YAML, the file people edit, as the JSON that SAM deploys.

    python -m retrain.statemachine            # write statemachine/retrain.asl.json (make statemachine)
    python -m retrain.statemachine --check    # exit 1 if the JSON is not the YAML's rendering

`statemachine/retrain.asl.yaml` writes the Retry policy and the failure branch's Catch once, as
anchors, and explains each state in comments. CloudFormation does not take YAML aliases, and
asl-validator, cfn-lint and the offline stack read JSON, so the deployed definition stays JSON:
the YAML with its aliases resolved, its comments and its `Shared` block (the anchors' home, not
ASL) left out, keys in the YAML's order. `${...}` DefinitionSubstitutions are plain strings in both.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "statemachine" / "retrain.asl.yaml"
TARGET = ROOT / "statemachine" / "retrain.asl.json"
SHARED = "Shared"  # where the YAML keeps its anchors; not part of the definition


class StateMachineSourceError(ValueError):
    """The YAML is not a state machine definition the JSON can be rendered from."""


def definition(source: Path = SOURCE) -> dict[str, Any]:
    """The definition the YAML describes, anchors resolved, without its `Shared` block."""
    document = yaml.safe_load(source.read_text(encoding="utf-8"))
    if not isinstance(document, dict) or not isinstance(document.get("States"), dict):
        raise StateMachineSourceError(f"{source} is not a state machine definition (no States mapping)")
    document.pop(SHARED, None)
    return document


def render(source: Path = SOURCE) -> str:
    """The JSON text of the definition, as it is committed: two-space indent, a final newline."""
    return json.dumps(definition(source), indent=2, ensure_ascii=False) + "\n"


def is_current(source: Path = SOURCE, target: Path = TARGET) -> bool:
    """The JSON is exactly the YAML's rendering (byte for byte: no hand edit, no stale file)."""
    return target.exists() and target.read_text(encoding="utf-8") == render(source)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--check"]:
        if is_current():
            return 0
        print(f"{TARGET.relative_to(ROOT)} is not the rendering of {SOURCE.relative_to(ROOT)}: run make statemachine")
        return 1
    if args:
        print(__doc__)
        return 2
    text = render()
    TARGET.write_text(text, encoding="utf-8")
    print(f"{TARGET.relative_to(ROOT)}: {text.count(chr(10))} lines from {SOURCE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
