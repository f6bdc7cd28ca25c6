"""`retrain local demo --json`: the story on stderr, how it ended on stdout as one document.

The demo itself takes minutes (tests/integration/test_local_commands.py runs it, marked slow);
here a stand-in plays it at once, so what the command does with its result is checked quickly:
where the story goes, the document, the exit code."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner, Result

from functions.common.summary import RunArtifacts, RunSummary
from retrain.cli import app
from retrain.local import demo as demo_module
from retrain.local.demo import DemoOptions, DemoResult, Place

STORY = "> Where to look"
BUCKET = "retrain-local-data-123456789012-us-east-1"


def ended(out: Path, *, ok: bool = True) -> DemoResult:
    run = "ds-20270301-090000-4f2a"
    summary = RunSummary(
        run=run,
        outcome="accepted",
        dataset_version=run,
        finished_at=datetime(2027, 3, 1, 9, 5, tzinfo=UTC),
        miou=0.61,
        artifacts=RunArtifacts(
            folder=f"s3://{BUCKET}/reports/runs/{run}/", summary=f"s3://{BUCKET}/reports/runs/{run}/summary.json"
        ),
    )
    folder = out / run
    return DemoResult(
        ok=ok,
        run=run,
        summary=summary,
        local_folder=folder,
        report=folder / "report.html",
        problems=[] if ok else ["3 objects of berlin-20270301-085500 not accounted for"],
        first_run="ds-20270301-085800-1b3c",
        batches=["munich-20270301-085500", "berlin-20270301-085500"],
        bucket=BUCKET,
        function_log=out / "logs" / "demo-20270301-085500.log",
        places=[Place("profiling report", folder / "report.html", f"s3://{BUCKET}/reports/runs/{run}/report.html")],
    )


def play(monkeypatch: pytest.MonkeyPatch, result: DemoResult, *args: str) -> tuple[Result, DemoOptions]:
    """`retrain local demo ARGS` with a stand-in demo that tells one line and ends with `result`."""
    seen: list[DemoOptions] = []

    class StandIn:
        def __init__(self, options: DemoOptions, console: Console) -> None:
            seen.append(options)
            self.console = console

        def run(self) -> DemoResult:
            self.console.print(STORY)
            return result

    monkeypatch.setattr(demo_module, "Demo", StandIn)
    played = CliRunner().invoke(app, ["local", "demo", *args])
    return played, seen[0]


def test_local_demo_json_prints_how_it_ended_and_tells_the_story_on_stderr(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    result = ended(tmp_path)

    played, options = play(monkeypatch, result, "--out", str(tmp_path), "--json")

    assert played.exit_code == 0, played.output
    assert options.out == tmp_path
    document: dict[str, Any] = json.loads(played.stdout)
    assert document["ok"] is True and document["problems"] == []
    assert (document["first_run"], document["run"]) == (result.first_run, result.run)
    assert document["batches"] == result.batches and document["bucket"] == BUCKET
    assert (document["local_folder"], document["report"]) == (str(result.local_folder), str(result.report))
    assert document["function_log"] == str(result.function_log)
    assert (document["summary"]["outcome"], document["summary"]["miou"]) == ("accepted", 0.61)
    assert document["places"] == [
        {
            "what": "profiling report",
            "path": str(result.report),
            "s3_uri": f"s3://{BUCKET}/reports/runs/{result.run}/report.html",
        }
    ]
    assert STORY in played.stderr and STORY not in played.stdout


def test_local_demo_json_that_did_not_end_as_expected_still_says_how_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    played, _ = play(monkeypatch, ended(tmp_path, ok=False), "--out", str(tmp_path), "--json")

    assert played.exit_code == 1
    document = json.loads(played.stdout)
    assert document["ok"] is False and document["problems"] == ["3 objects of berlin-20270301-085500 not accounted for"]
    assert "the loop did not end as expected" in played.stderr


def test_local_demo_without_json_tells_the_story_on_stdout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    played, _ = play(monkeypatch, ended(tmp_path), "--out", str(tmp_path))

    assert played.exit_code == 0, played.output
    assert STORY in played.stdout and played.stderr == ""
