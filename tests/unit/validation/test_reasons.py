"""The reason codes are a contract: stable, documented, machine-friendly."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from functions.validation import DESCRIPTIONS, ReasonCode, Status


def test_every_reason_code_is_documented() -> None:
    assert set(DESCRIPTIONS) == set(ReasonCode)
    assert all(description and description[0].islower() for description in DESCRIPTIONS.values())


def test_the_manual_tables_every_reason_code_and_no_other() -> None:
    manual = (Path(__file__).resolve().parents[3] / "docs" / "validation.md").read_text(encoding="utf-8")
    table = manual.split("## Reason codes", 1)[1].split("\n\n", 2)[1]
    tabled = {code for row in table.splitlines()[2:] for code in re.findall(r"`([a-z0-9_]+)`", row.split("|")[1])}

    assert tabled == {code.value for code in ReasonCode}


def test_reason_codes_are_snake_case_and_distinct() -> None:
    values = [code.value for code in ReasonCode]

    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", value) for value in values)
    assert len(set(values)) == len(values)


def test_the_statuses_are_the_four_the_reports_expect() -> None:
    assert [status.value for status in Status] == ["valid", "invalid", "incomplete", "duplicate"]


def test_the_validation_core_stays_small_enough_for_the_intake_lambda() -> None:
    """No AWS SDK, numpy, torch or CLI libraries: a fresh interpreter proves it."""
    probe = (
        "import sys, functions.validation; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'boto3', 'botocore', 'numpy', 'torch', 'typer', 'rich'}))"
    )

    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
