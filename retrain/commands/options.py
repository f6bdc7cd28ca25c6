"""What several commands share: `--json`, and the one document it prints.

Every command that reports a result takes `--json` (tests/unit/test_cli_options.py keeps the
list of those that report none). With it, stdout carries exactly one JSON document, the result
as the command's own pydantic model or dataclass dumps it; progress, tables and hints go to
stderr or are left out, errors go to stderr in words, and the exit codes stay what they are.
`retrain validate --json` differs on purpose: one JSON object per item, as each is checked.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from pydantic import TypeAdapter

JsonOption = Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")]


def print_json(document: object) -> None:
    """`document` (a pydantic model or a dataclass, nested ones too) as `--json`'s one document."""
    adapter: TypeAdapter[Any] = TypeAdapter(type(document))
    # print, not rich: nothing may wrap, colour or mark up the document.
    print(adapter.dump_json(document, indent=2).decode())
