"""`retrain data purge` lists what it will erase and asks first, as the AWS CLI's and SAM's
destructive commands do: only a yes erases; `--yes` is for scripts, and a purge with no terminal
to ask on and no `--yes` refuses before it reads anything. On moto's S3 and DynamoDB, with the
template's table; the questions are answered on a real terminal (a pty) as a person would."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
import typer.main
from moto import mock_aws
from typer.testing import CliRunner

from functions.data.ledger import Ledger
from retrain.cli import app
from retrain.local.cloudformation.stack import create_ledger_table
from tests.unit.trust_stories import curate

NOW = datetime(2027, 3, 1, 9, 0, tzinfo=UTC)
ENV = {"DATA_BUCKET": "data", "LEDGER_TABLE": "ledger", "COLUMNS": "200"}
FACE = ("dataset/images/munich-12/face-0.jpg", "dataset/labels/munich-12/face-0.png")


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Ledger, Any]]:
    """munich-12's pairs curated: the ledger's records and the bucket's copies."""
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="data")
        s3.put_bucket_versioning(Bucket="data", VersioningConfiguration={"Status": "Enabled"})
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        create_ledger_table(dynamodb, "ledger")
        ledger = Ledger(dynamodb, "ledger")
        curate(ledger, "munich-12", ["face-0", "street-1"], at=NOW)
        for stem in ("face-0", "street-1"):
            s3.put_object(Bucket="data", Key=f"dataset/images/munich-12/{stem}.jpg", Body=b"a face")
            s3.put_object(Bucket="data", Key=f"dataset/labels/munich-12/{stem}.png", Body=b"its label")
        yield ledger, s3


def keys(s3: Any) -> set[str]:
    listed = s3.list_object_versions(Bucket="data")
    return {item["Key"] for kind in ("Versions", "DeleteMarkers") for item in listed.get(kind, [])}


@contextmanager
def terminal(monkeypatch: pytest.MonkeyPatch, typed: bytes) -> Iterator[None]:
    """stdin a terminal (the follower end of a pty) on which `typed` was typed."""
    leader, follower = os.openpty()
    os.write(leader, typed)
    with os.fdopen(follower, encoding="utf-8") as stdin:
        monkeypatch.setattr("sys.stdin", stdin)
        try:
            yield
        finally:
            os.close(leader)


def at_a_terminal(monkeypatch: pytest.MonkeyPatch, typed: bytes, *args: str) -> int:
    """`retrain data purge ARGS` answered with `typed`; its exit code (CliRunner would replace stdin)."""
    with terminal(monkeypatch, typed):
        code = typer.main.get_command(app).main(["data", "purge", *args], prog_name="retrain", standalone_mode=False)
    return int(code or 0)


@pytest.mark.parametrize(
    ("typed", "why"),
    [(b"n\n", "no"), (b"\n", "Enter: the default is no"), (b"\x04", "end of input (Ctrl-D)")],
)
def test_anything_but_yes_erases_nothing(
    aws: tuple[Ledger, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], typed: bytes, why: str
) -> None:
    ledger, s3 = aws
    before = keys(s3)

    code = at_a_terminal(monkeypatch, typed, "munich-12/face-0")

    said = capsys.readouterr()
    assert code == 1, (why, said)
    assert keys(s3) == before, why
    assert ledger.pair("munich-12", "face-0") is not None, why
    # What it would have erased was listed before the question, and the question named the count.
    assert "Will erase: object versions (2)" in said.out and FACE[0] in said.out, said.out
    assert "Erase these 2 object versions and 1 ledger item for good? [y/N]" in said.err, said.err
    assert "nothing was erased" in said.err


def test_yes_erases_what_was_listed(
    aws: tuple[Ledger, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger, s3 = aws

    code = at_a_terminal(monkeypatch, b"y\n", "munich-12/face-0")

    said = capsys.readouterr()
    assert code == 0, said
    assert not keys(s3) & set(FACE), "the pair's copies are still there"
    assert {key for key in keys(s3) if "street-1" in key} == {
        "dataset/images/munich-12/street-1.jpg",
        "dataset/labels/munich-12/street-1.png",
    }, "a neighbour was erased"
    assert ledger.pair("munich-12", "face-0") is None
    assert "Will erase: object versions (2)" in said.out and "Erased: object versions (2)" in said.out


def test_without_a_terminal_and_without_yes_it_refuses_before_reading_anything(
    aws: tuple[Ledger, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, s3 = aws
    before = keys(s3)

    def no_connection(*_: object, **__: object) -> None:
        raise AssertionError("the purge connected")

    from retrain.commands import data  # noqa: PLC0415

    with monkeypatch.context() as patched:
        patched.setattr(data, "_connect", no_connection)
        result = CliRunner().invoke(app, ["data", "purge", "munich-12/face-0"], input="y\n")

    assert result.exit_code == 2, result.output
    assert "pass --yes" in " ".join(result.output.split())
    assert "nothing was erased" in result.output
    assert keys(s3) == before and ledger.pair("munich-12", "face-0") is not None


def test_yes_erases_without_asking_for_scripts(aws: tuple[Ledger, Any]) -> None:
    ledger, s3 = aws

    result = CliRunner().invoke(app, ["data", "purge", "munich-12/face-0", "--yes", "--json"])

    assert result.exit_code == 0, result.output
    assert "Erase these" not in result.output
    assert not keys(s3) & set(FACE) and ledger.pair("munich-12", "face-0") is None


def test_a_dry_run_asks_nothing_without_a_terminal(aws: tuple[Ledger, Any]) -> None:
    _, s3 = aws
    before = keys(s3)

    result = CliRunner().invoke(app, ["data", "purge", "munich-12/face-0", "--dry-run"])

    assert result.exit_code == 0, result.output
    assert "Would erase: object versions (2)" in result.output and "Erase these" not in result.output
    assert keys(s3) == before


def test_under_json_the_list_and_the_question_go_to_stderr(
    aws: tuple[Ledger, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json  # noqa: PLC0415

    code = at_a_terminal(monkeypatch, b"y\n", "munich-12/face-0", "--json")

    said = capsys.readouterr()
    assert code == 0, said
    assert said.out.startswith("{") and json.loads(said.out)["dry_run"] is False, "stdout is not the one document"
    assert "Will erase" in said.err and "Erase these 2 object versions" in said.err
