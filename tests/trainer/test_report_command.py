"""`retrain report`: a run's report rendered again, elsewhere, with the run's own rule parameters.

The run folder is made by the trainer's own profiler (`Profiler`, as `trainer.train` drives it),
started with `--rule-parameters`-style overrides: DataStall's threshold raised to 0.9, so the
run's half-stalled steps are fine by the run's standard and an issue by the default one (0.2).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner, Result

from functions.common.rules import parse_rules_file
from retrain.commands import report as report_command
from trainer.profiling import rerender
from trainer.profiling.session import Profiler

JOB = "retrain-v3-test"
RAISED = {"DataStall": {"threshold": 0.9}}
LOADER = {"workers": 0, "decoder": "pillow"}
METRICS = {
    "dataset_version": "v3-lineage",
    "loader": LOADER,
    "epochs": [{"epoch": 0, "train_loss": 2.0, "miou": 0.2}, {"epoch": 1, "train_loss": 1.5, "miou": 0.3}],
}


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run's output folder: profile/, metrics.json, rules.json, report.html."""
    output = tmp_path_factory.mktemp("run") / "output"
    output.mkdir()
    (output / "metrics.json").write_text(json.dumps(METRICS))
    profiler = Profiler(output, interval_ms=100, overrides=RAISED, loader=LOADER).start()
    now = time.time()
    for step in range(1, 31):
        # Half of every step waits for data: a 50 % stall.
        profiler.step(
            step=step,
            epoch=0,
            start=now + step * 0.01,
            data_wait=0.005,
            compute=0.005,
            communication=0.0,
            loss=3.0 - 0.05 * step,
        )
    time.sleep(0.3)  # a few host samples
    assert profiler.finish(job_name=JOB, metrics=METRICS) is not None
    return output


@pytest.fixture
def run(recorded_run: Path, tmp_path: Path) -> Path:
    """A copy of the run for one test (some tests edit it)."""
    copy = tmp_path / "train-out" / "output"
    shutil.copytree(recorded_run, copy)
    return copy


def invoke(*args: str) -> Result:
    app = typer.Typer()
    app.command()(report_command.command)
    return CliRunner().invoke(app, list(args))


def fingerprint(folder: Path) -> dict[str, str]:
    return {
        path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def stall_row(page: str) -> str:
    """DataStall's row of the rule table: its status badge and its parameters."""
    start = page.index("<tr><td><b>DataStall</b>")
    return page[start : page.index("</tr>", start)]


def test_the_report_goes_to_out_and_the_run_is_left_byte_for_byte(run: Path, tmp_path: Path) -> None:
    before = fingerprint(run)
    target = tmp_path / "elsewhere" / "copy.html"
    result = invoke(str(run), "-o", str(target))
    assert result.exit_code == 0, result.output
    assert fingerprint(run) == before, "the run's folder changed"
    page = target.read_text()
    assert page.startswith("<!doctype html>") and JOB in page and "v3-lineage" in page
    row = stall_row(page)
    assert "badge NoIssuesFound" in row and "threshold=0.9" in row, "the run's parameter and verdict are kept"
    assert f"report: {target.resolve()}" in result.stdout
    assert target.resolve().as_uri() in result.stdout
    assert "recorded verdicts" in result.stderr
    assert not list(target.parent.glob(".*.partial")), "the report is written whole"


def test_report_json_names_the_file_written_and_the_verdicts_it_shows(run: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "copy.html"

    result = invoke(str(run), "-o", str(target), "--json")
    what_if = invoke(str(run), "-o", str(target), "--rule-parameters", '{"DataStall": {"threshold": 0.1}}', "--json")

    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert (document["report"], document["url"]) == (str(target.resolve()), target.resolve().as_uri())
    assert Path(document["run_folder"]).resolve() == run.resolve()
    assert (document["job_name"], document["verdicts"]) == (JOB, "recorded")
    stall = next(rule for rule in document["rules"] if rule["name"] == "DataStall")
    assert (stall["status"], stall["parameters"]["threshold"]) == ("NoIssuesFound", "0.9")
    assert "DataStall" not in document["issues"] and document["summary"].startswith("Profiler rules (builtin)")
    assert "recorded verdicts" in result.stderr, "the summary line stays on stderr"
    assert what_if.exit_code == 0, what_if.output
    document = json.loads(what_if.stdout)
    assert document["verdicts"] == "re-evaluated" and "DataStall" in document["issues"]


def test_the_profile_folder_or_a_train_out_folder_names_the_run_too(run: Path, tmp_path: Path) -> None:
    for given in (run / "profile", run.parent):
        target = tmp_path / f"{given.name}.html"
        result = invoke(str(given), "-o", str(target))
        assert result.exit_code == 0, result.output
        assert "threshold=0.9" in stall_row(target.read_text())


def test_a_folder_out_gets_report_html_and_the_default_is_the_current_folder(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    assert invoke(str(run), "-o", str(folder)).exit_code == 0
    assert (folder / "report.html").is_file()
    monkeypatch.chdir(tmp_path)
    assert invoke(str(run)).exit_code == 0
    assert (tmp_path / "report.html").is_file()


def test_re_evaluation_uses_the_parameters_the_run_recorded(run: Path, tmp_path: Path) -> None:
    target = tmp_path / "again.html"
    before = fingerprint(run)
    result = invoke(str(run), "-o", str(target), "--re-evaluate")
    assert result.exit_code == 0, result.output
    assert "re-evaluated with the run's parameters" in result.stderr
    row = stall_row(target.read_text())
    assert "badge NoIssuesFound" in row and "threshold=0.9" in row, "re-evaluated with the defaults?"
    assert fingerprint(run) == before

    # A threshold changed in rules.json is the one the rules run with: the verdict follows it.
    rules_path = run / "rules.json"
    document = json.loads(rules_path.read_text())
    stall = next(rule for rule in document["rules"] if rule["name"] == "DataStall")
    stall["parameters"]["threshold"] = "0.3"
    rules_path.write_text(json.dumps(document))
    assert invoke(str(run), "-o", str(target), "--re-evaluate").exit_code == 0
    row = stall_row(target.read_text())
    assert "badge IssuesFound" in row and "threshold=0.3" in row


def test_rule_parameters_change_this_report_only(run: Path, tmp_path: Path) -> None:
    target = tmp_path / "what-if.html"
    result = invoke(str(run), "-o", str(target), "--rule-parameters", '{"DataStall": {"threshold": 0.1}}')
    assert result.exit_code == 0, result.output
    assert "badge IssuesFound" in stall_row(target.read_text())
    recorded = parse_rules_file((run / "rules.json").read_text())
    assert next(r for r in recorded.rules if r.name == "DataStall").parameters["threshold"] == "0.9"

    for bad, says in (
        ("{not json", "not JSON"),
        ('{"DataStall": 0.1}', "must map rule names"),
        ('{"Nope": {}}', "Nope"),
    ):
        result = invoke(str(run), "-o", str(target), "--rule-parameters", bad)
        assert result.exit_code == 2 and says in result.stderr, result.output
        assert "Traceback" not in result.output


def test_without_rules_json_the_defaults_are_used_and_stderr_says_so(run: Path, tmp_path: Path) -> None:
    (run / "rules.json").unlink()
    target = tmp_path / "defaults.html"
    result = invoke(str(run), "-o", str(target))
    assert result.exit_code == 0, result.output
    assert "rules.json is missing" in result.stderr and "default parameters" in result.stderr
    row = stall_row(target.read_text())
    assert "badge IssuesFound" in row and "threshold=0.2" in row
    assert not (run / "rules.json").exists(), "nothing is written into the run's folder"


def test_verdicts_older_than_the_profile_are_flagged(run: Path, tmp_path: Path) -> None:
    rules_path = run / "rules.json"
    document = json.loads(rules_path.read_text())
    document["generated_at"] = "2000-01-01T00:00:00+00:00"  # a periodic evaluation, long before the end
    rules_path.write_text(json.dumps(document))
    result = invoke(str(run), "-o", str(tmp_path / "r.html"))
    assert result.exit_code == 0, result.output
    assert "cover only part of the run" in result.stderr


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda root: root / "absent", "does not exist"),
        (lambda root: root, "holds no profiling output"),
        (lambda root: root / "a-file.txt", "is a file"),
    ],
)
def test_a_folder_that_is_not_a_run_is_refused_with_exit_2(
    tmp_path: Path, make: Callable[[Path], Path], says: str
) -> None:
    (tmp_path / "a-file.txt").write_text("x")
    (tmp_path / "images").mkdir()
    result = invoke(str(make(tmp_path)), "-o", str(tmp_path / "r.html"))
    assert result.exit_code == 2, result.output
    assert says in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "r.html").exists()


def test_a_broken_rules_json_is_an_error_not_a_traceback(run: Path, tmp_path: Path) -> None:
    (run / "rules.json").write_text("{half")
    result = invoke(str(run), "-o", str(tmp_path / "r.html"))
    assert result.exit_code == 2 and "cannot read" in result.stderr, result.output


def test_the_runs_own_files_are_protected(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = fingerprint(run)
    for target in ("rules.json", "metrics.json", "profile/steps/rank0.jsonl"):
        result = invoke(str(run), "-o", str(run / target))
        assert result.exit_code == 2 and "run's own data" in result.stderr, result.output
    monkeypatch.chdir(run)
    result = invoke(str(run))
    assert result.exit_code == 2 and "pass -o report.html to replace it" in result.stderr, result.output
    assert fingerprint(run) == before

    # Asked for by name, the run's report is replaced; its rules.json still is not touched.
    result = invoke(str(run), "-o", "report.html")
    assert result.exit_code == 0, result.output
    after = fingerprint(run)
    assert after["rules.json"] == before["rules.json"] and set(after) == set(before)


def test_python_m_rerender_keeps_the_runs_parameters_and_job_name(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert rerender.main([str(run)]) == 0
    rewritten = parse_rules_file((run / "rules.json").read_text())
    assert rewritten.job_name == JOB
    stall = next(r for r in rewritten.rules if r.name == "DataStall")
    assert stall.parameters["threshold"] == "0.9" and stall.status == "NoIssuesFound"
    assert "default" not in capsys.readouterr().err


def test_python_m_rerender_says_when_it_falls_back_to_the_defaults(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (run / "rules.json").unlink()
    assert rerender.main([str(run)]) == 0
    assert "default parameters" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        rerender.main([str(run / "profile" / "steps" / "rank0.jsonl")])
    assert exit_info.value.code == 2


def test_re_evaluation_keeps_what_only_the_training_loop_knew(run: Path) -> None:
    rules_path = run / "rules.json"
    document = json.loads(rules_path.read_text())
    for rule in document["rules"]:
        if rule["name"] == "MaxInitializationTime":
            # The job waited an hour for its first step (a slow rendezvous, say).
            rule["evidence"]["initialization_seconds"] = 3600.0
        if rule["name"] == "DataStall":
            rule["evidence"]["stopped_training"] = True
    rules_path.write_text(json.dumps(document))
    rendered = rerender.load(rerender.find_run(run), re_evaluate=True)
    results = {result.name: result for result in rendered.results}
    assert results["MaxInitializationTime"].status == "IssuesFound", "the job's start time was lost"
    assert results["DataStall"].evidence.get("stopped_training") is True
    assert "stopped the training" in (results["DataStall"].detail or "")


def test_recorded_parameters_come_back_as_the_values_the_rules_took() -> None:
    document = {
        "rules": [
            {"name": "StepOutlier", "parameters": {"stddev": "3", "mode": "None", "n_steps": "100"}},
            {"name": "DataStall", "parameters": {"threshold": "0.25", "scan_interval_s": "60.0"}},
            {"name": "LossNotDecreasing", "parameters": {"mode": "TRAIN", "diff_percent": 0.0}},
        ]
    }
    assert rerender.recorded_parameters(document) == {
        "StepOutlier": {"stddev": 3, "mode": None, "n_steps": 100},
        "DataStall": {"threshold": 0.25, "scan_interval_s": 60.0},
        "LossNotDecreasing": {"mode": "TRAIN", "diff_percent": 0.0},
    }
