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
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from retrain import target
from retrain.cli import app

from .validation.corpus import jpeg, mask

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("moto", "werkzeug", "cheroot", "cfnlint", "torch")
# What the `local` and `trainer` extras bring, and `retrain[cli]` lacks.
NOT_IN_CLI_EXTRA = (*HEAVY, "psutil", "packaging", "numpy")

LOADED = """
import json, sys
from typer.testing import CliRunner
from retrain.cli import app
result = CliRunner().invoke(app, sys.argv[1:])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r} or m.startswith("retrain.local"))
print(json.dumps({{"exit": result.exit_code, "output": result.output, "heavy": heavy}}))
"""

WITHOUT = """
import json, sys
for name in {blocked!r}:
    sys.modules[name] = None  # `import name` now fails, as where it is not installed
from typer.testing import CliRunner
from retrain.cli import app
result = CliRunner().invoke(app, sys.argv[1:])
print(json.dumps({{"exit": result.exit_code, "output": result.output}}))
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


def _every_command(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command's words (`("data", "status")`), from the tree Typer builds (its own click)."""
    found = [path] if path else []
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        found += _every_command(sub, (*path, name))
    return found


@pytest.mark.parametrize("path", _every_command(typer.main.get_command(app)), ids=" ".join)
def test_every_command_helps_with_the_cli_extra_alone(path: tuple[str, ...]) -> None:
    found = _fresh(WITHOUT.format(blocked=NOT_IN_CLI_EXTRA), *path, "--help")
    assert found["exit"] == 0, found["output"]


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["local", "up"], "local"),
        (["local", "demo"], "local"),
        (["synth", "/nonexistent/scenes"], "trainer"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else value,
)
def test_a_command_that_needs_an_extra_names_it(args: list[str], extra: str) -> None:
    found = _fresh(WITHOUT.format(blocked=NOT_IN_CLI_EXTRA), *args)
    assert found["exit"] == 2
    output = str(found["output"])
    assert f"pip install 'retrain[{extra}]'" in output
    assert "Traceback" not in output
    assert len(output.strip().splitlines()) == 1, output


def test_validate_runs_with_the_cli_extra_alone(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    (tmp_path / "images" / "a.jpg").write_bytes(jpeg())
    (tmp_path / "labels" / "a.png").write_bytes(mask())
    found = _fresh(WITHOUT.format(blocked=NOT_IN_CLI_EXTRA), "validate", str(tmp_path))
    assert found["exit"] == 0, found["output"]


def test_the_offline_stack_names_agree_with_its_options() -> None:
    from retrain.local.cloudformation.stack import StackOptions  # noqa: PLC0415

    assert (StackOptions().stack_name, StackOptions().region) == (target.OFFLINE_STACK_NAME, target.OFFLINE_REGION)


def test_help_is_the_same_in_this_process() -> None:
    assert CliRunner().invoke(app, ["--help"]).exit_code == 0
