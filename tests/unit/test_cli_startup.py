"""`retrain` answers at once: building the app, and its help, load no offline stack.

Every `retrain` call builds the whole command tree, `--help` included. The command modules
therefore import the offline stack (moto, werkzeug: `retrain.local`), cfn-lint and torch inside
the commands that use them, and an annotator's `retrain validate` neither waits for them nor needs
them installed (`pip install 'retrain[cli]'`). Each check runs in a fresh interpreter, so that what
this test process has imported does not count. Nothing here is timed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from retrain import target
from retrain.cli import app

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("moto", "werkzeug", "cfnlint", "torch")

LOADED = """
import json, sys
from typer.testing import CliRunner
from retrain.cli import app
result = CliRunner().invoke(app, sys.argv[1:])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r} or m.startswith("retrain.local"))
print(json.dumps({{"exit": result.exit_code, "output": result.output, "heavy": heavy}}))
"""


def _fresh(script: str, *args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": "/nonexistent", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize(
    "args",
    [["--help"], ["validate", "--help"], ["data", "--help"], ["runs", "--help"]],
    ids=" ".join,
)
def test_help_loads_no_offline_stack(args: list[str]) -> None:
    found = _fresh(LOADED.format(heavy=set(HEAVY)), *args)
    assert found["exit"] == 0, found["output"]
    assert found["heavy"] == []


def test_the_offline_stack_names_agree_with_its_options() -> None:
    from retrain.local.cloudformation.stack import StackOptions  # noqa: PLC0415

    assert (StackOptions().stack_name, StackOptions().region) == (target.OFFLINE_STACK_NAME, target.OFFLINE_REGION)


def test_help_is_the_same_in_this_process() -> None:
    assert CliRunner().invoke(app, ["--help"]).exit_code == 0
