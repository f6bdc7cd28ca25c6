"""The offline checks of `make validate-template` catch what they are there for.

Each tool runs on the real file (it must pass) and on a deliberately broken copy in a temporary
folder (it must fail, for the reason broken in): cfn-lint, `sam validate --lint`, asl-validator
and checkov, each from the environment the Makefile installs it in (`make tools`; `make test`
installs them first). Where a tool is missing the test is skipped, except under CI, where that
fails: CI must run them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
ASL = ROOT / "statemachine" / "retrain.asl.json"
TOOLS = {
    "cfn-lint": ROOT / ".venv" / "bin" / "cfn-lint",
    "sam": ROOT / ".tools" / "sam" / "bin" / "sam",
    "asl-validator": ROOT / ".tools" / "node_modules" / ".bin" / "asl-validator",
    "checkov": ROOT / ".tools" / "checkov" / "bin" / "checkov",
}
# The public-access block of an S3 bucket, one check per setting.
PUBLIC_ACCESS_CHECKS = {"CKV_AWS_53", "CKV_AWS_54", "CKV_AWS_55", "CKV_AWS_56"}

pytestmark = pytest.mark.tools


def tool(name: str) -> Path:
    path = TOOLS[name]
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"CI must have {name} at {path}: `make test` installs it (make tools)")
        pytest.skip(f"{name} is not installed at {path}: run `make tools`")
    return path


def run(command: list[str | Path], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "SAM_CLI_TELEMETRY": "0", "AWS_DEFAULT_REGION": "us-east-1"}
    return subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
        check=False,
    )


def resource_block(text: str, logical_id: str) -> tuple[int, int]:
    """(start, end) of a resource's lines in the template: up to the next resource, comment or section."""
    start = text.index(f"\n  {logical_id}:\n") + 1
    following = re.compile(r"^(  \S|\S)", flags=re.MULTILINE).search(text, start + len(logical_id) + 4)
    return start, following.start() if following else len(text)


def broken_template(folder: Path, logical_id: str, change: Any) -> Path:
    """A copy of the stack's files in `folder` whose resource `logical_id` is passed through `change`."""
    shutil.copytree(ROOT / "statemachine", folder / "statemachine")
    text = TEMPLATE.read_text(encoding="utf-8")
    start, end = resource_block(text, logical_id)
    changed = change(text[start:end])
    assert changed != text[start:end], f"nothing was broken in {logical_id}"
    copy = folder / "template.yaml"
    copy.write_text(text[:start] + changed + text[end:], encoding="utf-8")
    return copy


def with_unknown_property(block: str) -> str:
    return block.replace("    Properties:\n", "    Properties:\n      NotAProperty: true\n", 1)


def public_bucket(block: str) -> str:
    """The bucket's public-access block switched off: a bucket that may be made public."""
    return re.sub(
        r"(BlockPublicAcls|BlockPublicPolicy|IgnorePublicAcls|RestrictPublicBuckets): true", r"\1: false", block
    )


def output(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"


# --------------------------------------------------------------- cfn-lint --
def test_cfn_lint_passes_the_template() -> None:
    done = run([tool("cfn-lint"), TEMPLATE], cwd=ROOT)
    assert done.returncode == 0, output(done)


def test_cfn_lint_fails_on_an_unknown_property(tmp_path: Path) -> None:
    copy = broken_template(tmp_path, "DataBucket", with_unknown_property)
    done = run([tool("cfn-lint"), copy], cwd=tmp_path)
    assert done.returncode != 0, output(done)
    assert "E3002" in done.stdout and "NotAProperty" in done.stdout, output(done)


# ---------------------------------------------------------- sam validate --
def test_sam_validate_passes_the_template() -> None:
    done = run([tool("sam"), "validate", "--lint", "--template-file", TEMPLATE], cwd=ROOT)
    assert done.returncode == 0, output(done)


def test_sam_validate_fails_on_an_unknown_function_property(tmp_path: Path) -> None:
    copy = broken_template(tmp_path, "NotifyFunction", with_unknown_property)
    done = run([tool("sam"), "validate", "--lint", "--template-file", copy], cwd=tmp_path)
    assert done.returncode != 0, output(done)
    assert "NotAProperty" in done.stdout + done.stderr, output(done)


# ---------------------------------------------------------- asl-validator --
def test_asl_validator_passes_the_state_machine() -> None:
    done = run([tool("asl-validator"), "--json-path", ASL], cwd=ROOT)
    assert done.returncode == 0, output(done)


def test_asl_validator_fails_on_a_next_to_no_state(tmp_path: Path) -> None:
    definition = json.loads(ASL.read_text(encoding="utf-8"))
    first = definition["States"][definition["StartAt"]]
    assert "Next" in first, "the first state has no Next to break"
    first["Next"] = "A state that does not exist"
    copy = tmp_path / "retrain.asl.json"
    copy.write_text(json.dumps(definition, indent=2), encoding="utf-8")
    done = run([tool("asl-validator"), "--json-path", copy], cwd=tmp_path)
    assert done.returncode != 0, output(done)
    assert "A state that does not exist" in done.stdout + done.stderr, output(done)


# ---------------------------------------------------------------- checkov --
def checkov(template: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    done = run(
        [tool("checkov"), "--file", template, "--framework", "cloudformation", "--skip-download", "--output", "json"],
        cwd=template.parent,
    )
    try:
        report = json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"checkov printed no JSON report:\n{output(done)}")
    return done, report


def failed(report: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((check["check_id"], check["resource"]) for check in report["results"]["failed_checks"])


def test_checkov_passes_the_template() -> None:
    done, report = checkov(TEMPLATE)
    findings = "\n".join(f"{check} {resource}" for check, resource in failed(report))
    assert not findings, f"fix these, or skip one next to its resource with the reason:\n{findings}"
    assert done.returncode == 0, output(done)
    assert report["summary"]["passed"] > 0


def test_checkov_fails_on_a_public_bucket(tmp_path: Path) -> None:
    copy = broken_template(tmp_path, "DataBucket", public_bucket)
    done, report = checkov(copy)
    assert done.returncode != 0, output(done)
    on_bucket = {check for check, resource in failed(report) if resource == "AWS::S3::Bucket.DataBucket"}
    assert on_bucket >= PUBLIC_ACCESS_CHECKS, failed(report)
