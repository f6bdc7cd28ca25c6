"""A run's profiling report rendered again, after the run, with the rule parameters it ran with.

The trainer writes `rules.json` and `report.html` beside `profile/` (and `metrics.json`) in its
output folder. Rendering that folder again must not quietly change what the run concluded:

- **Recorded verdicts by default.** When `rules.json` is there, its verdicts are the run's: the
  trainer evaluated them with facts no folder keeps (the process's start time, which
  `MaxInitializationTime` counts from; which rule stopped the run under `--stop-on-rule`), and
  they are what the notifications and the quality gate read. Re-evaluating would get those
  wrong, so the recorded verdicts are shown as they are.
- **Re-evaluation on request** (`re_evaluate=True`, or overrides given): every rule runs again on
  everything under `profile/`, with the parameters `rules.json` records for it (a run started
  with `--rule-parameters` keeps them), the overrides on top. Useful when the run died between
  two periodic evaluations (its `rules.json` then covers only part of the run: `rerender` says
  so) or to ask what a different threshold would have said. The start time is recovered from the
  recorded `MaxInitializationTime` evidence and the `--stop-on-rule` note is carried over.
- **No `rules.json`** (a run killed before its first evaluation): the rules are evaluated with
  their defaults, and a note says so; never silently.

`rules.json` records parameters as strings (`RuleEvaluation.parameters`); `recorded_parameters`
turns them back into the numbers and `None`s the rules were given.

`python -m trainer.profiling.rerender OUTPUT_DIR` (`main`) re-evaluates a run and rewrites its
`rules.json` and `report.html`; `retrain report` renders a copy instead.

No torch, and nothing from `functions` (the trainer ships alone): the rules file is read as the
plain JSON the trainer writes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainer.profiling import report, rules
from trainer.profiling.rules import ProfileData, RuleEvaluation
from trainer.screening import report as data_report

PROFILE_DIR = "profile"
METRICS_FILE = "metrics.json"
# `retrain train --out` keeps the trainer's output folder one level down.
TRAIN_OUTPUT_DIR = "output"
# Samples newer than rules.json by more than this mean its verdicts miss the end of the run. The
# final evaluation happens after the samplers stop, so only clock skew between hosts (their
# samples reach rank 0 with their own clocks) can put a sample after it: seconds at most.
STALE_AFTER_SECONDS = 5.0


class RunFolderError(ValueError):
    """The folder is not a run's profiling output, or what it holds cannot be read."""


@dataclass(frozen=True)
class RunFolder:
    """A run's output folder: `profile/`, and maybe `rules.json`, `report.html`, `metrics.json`."""

    output_dir: Path
    # Where metrics.json is, when not in `output_dir`.
    metrics_file: Path | None = None

    @property
    def profile_dir(self) -> Path:
        return self.output_dir / PROFILE_DIR

    @property
    def rules_path(self) -> Path:
        return self.output_dir / report.RULES_FILE

    @property
    def report_path(self) -> Path:
        return self.output_dir / report.REPORT_FILE

    @property
    def metrics_path(self) -> Path:
        return self.metrics_file or self.output_dir / METRICS_FILE

    def protected(self) -> tuple[Path, ...]:
        """The run's data files: no re-rendering may write over them (report.html is not one)."""
        return (self.rules_path, self.output_dir / METRICS_FILE, self.metrics_path)


def find_run(path: Path) -> RunFolder:
    """The run folder `path` names: the trainer's output folder (holding `profile/`), its
    `profile/` folder itself, or a `retrain train --out` folder (holding `output/profile/`)."""
    if not path.exists():
        raise RunFolderError(f"{path} does not exist")
    if not path.is_dir():
        raise RunFolderError(f"{path} is a file, not a run's folder")
    if (path / PROFILE_DIR).is_dir():
        return RunFolder(path)
    if path.name == PROFILE_DIR:
        return RunFolder(path.parent)
    if (path / TRAIN_OUTPUT_DIR / PROFILE_DIR).is_dir():
        return RunFolder(path / TRAIN_OUTPUT_DIR)
    raise RunFolderError(
        f"{path} holds no profiling output: expected the trainer's output folder (with "
        f"{PROFILE_DIR}/, {report.RULES_FILE} and {METRICS_FILE}; `retrain train` puts it in "
        f"OUT/{TRAIN_OUTPUT_DIR}) or its {PROFILE_DIR}/ folder (with system/ and steps/). "
        "A run trained with --profiling off has none."
    )


@dataclass
class Rendered:
    """What a report is made of, and what the reader must be told about it."""

    data: ProfileData
    results: list[RuleEvaluation]
    metrics: dict[str, Any] | None
    job_name: str | None
    # "recorded" (the run's own verdicts), "re-evaluated" (with the run's parameters) or
    # "defaults" (evaluated with the defaults: the run left no rules.json).
    verdicts: str
    # Caveats, one sentence each, for stderr: defaults used, verdicts that miss the run's end...
    notes: list[str] = field(default_factory=list)
    # The run's "New data" section (screening and each drop's impact), when it has one.
    new_data: str = ""

    def html(self) -> str:
        return report.render_html(
            self.data, self.results, job_name=self.job_name, metrics=self.metrics, new_data=self.new_data
        )


def load(
    run: RunFolder,
    *,
    re_evaluate: bool = False,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    job_name: str | None = None,
) -> Rendered:
    """What the report of `run` is made of (see `_load`), its "New data" section included."""
    rendered = _load(run, re_evaluate=re_evaluate, overrides=overrides, job_name=job_name)
    rendered.new_data = data_report.section(run.output_dir, rendered.metrics)
    return rendered


def _load(
    run: RunFolder,
    *,
    re_evaluate: bool = False,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    job_name: str | None = None,
) -> Rendered:
    """The run's report contents: recorded verdicts, or re-evaluated ones (see the module doc).

    Reads the folder, writes nothing. `overrides` imply re-evaluation; `job_name` replaces the
    recorded one.
    """
    notes: list[str] = []
    document = _read_rules(run)
    metrics = _read_metrics(run, notes)
    data = ProfileData.read(run.profile_dir, loader=dict((metrics or {}).get("loader") or {}))
    if not data.steps and not data.system:
        notes.append(f"{run.profile_dir} holds no samples and no steps: the report has nothing to show")
    name = job_name or (document or {}).get("job_name")
    if document is None:
        notes.append(
            f"{run.rules_path} is missing (the run ended before its first evaluation?): the rules are "
            "evaluated with their default parameters"
            + (" and the overrides given" if overrides else "")
            + ", and MaxInitializationTime counts from the first sample, not the job's start"
        )
        return Rendered(data, _evaluate(data, overrides), metrics, name, "defaults", notes)
    recorded = recorded_results(document, run.rules_path)
    if document.get("backend", "builtin") != "builtin":
        if re_evaluate or overrides:
            raise RunFolderError(
                f"{run.rules_path} holds SageMaker Debugger's verdicts (backend "
                f"{document.get('backend')!r}): only the built-in rules can be evaluated again"
            )
        return Rendered(data, recorded, metrics, name, "recorded", notes)
    if not re_evaluate and not overrides:
        stale = _stale_note(document, data, run)
        if stale:
            notes.append(stale)
        return Rendered(data, recorded, metrics, name, "recorded", notes)
    parameters = recorded_parameters(document)
    missing = [rule for rule in rules.RULE_NAMES if rule not in parameters]
    if missing:
        notes.append(
            f"{run.rules_path} has no entry for {', '.join(missing)} (a trainer older than this one?): "
            "those rules run with their default parameters"
        )
    for rule, values in (overrides or {}).items():
        parameters.setdefault(rule, {}).update(values)
    data.started_at = _started_at(recorded, data)
    results = _evaluate(data, parameters)
    _carry_stop_note(recorded, results)
    return Rendered(data, results, metrics, name, "re-evaluated", notes)


def recorded_parameters(document: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per rule, the parameters `rules.json` says it ran with, as the values the rules take.

    The trainer records them with `str()`: "500", "0.2", "None", "TRAIN" come back as 500, 0.2,
    None and "TRAIN".
    """
    parameters: dict[str, dict[str, Any]] = {}
    for entry in document.get("rules") or []:
        if isinstance(entry, Mapping) and isinstance(entry.get("parameters"), Mapping):
            parameters[str(entry["name"])] = {str(k): _typed(v) for k, v in entry["parameters"].items()}
    return parameters


def recorded_results(document: Mapping[str, Any], where: Path) -> list[RuleEvaluation]:
    """The verdicts of `rules.json`, as the renderer takes them."""
    entries = document.get("rules")
    if not isinstance(entries, list):
        raise RunFolderError(f"{where} has no list of rules")
    results = []
    for number, entry in enumerate(entries, start=1):
        try:
            results.append(
                RuleEvaluation(
                    name=str(entry["name"]),
                    status=str(entry["status"]),
                    trigger_count=int(entry.get("trigger_count") or 0),
                    violations=_optional_int(entry.get("violations")),
                    datapoints=_optional_int(entry.get("datapoints")),
                    evidence=dict(entry.get("evidence") or {}),
                    parameters={str(k): str(v) for k, v in (entry.get("parameters") or {}).items()},
                    recommendation=str(entry.get("recommendation") or ""),
                    detail=None if entry.get("detail") is None else str(entry["detail"]),
                    # Absent in files written before it: those rules judged, as far as they say.
                    applicable=_applicable(entry.get("applicable", True)),
                    not_applicable_reason=(
                        None if entry.get("not_applicable_reason") is None else str(entry["not_applicable_reason"])
                    ),
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise RunFolderError(f"{where}: rule {number} is not a rule entry ({error!r})") from error
    return results


def _typed(value: Any) -> Any:
    if not isinstance(value, str):
        return value  # a hand-written rules.json may hold numbers already
    if value == "None":
        return None
    if value in {"True", "False"}:
        return value == "True"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            continue
    return value


def _applicable(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"applicable is {value!r}, not true or false")
    return value


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _read_rules(run: RunFolder) -> dict[str, Any] | None:
    if not run.rules_path.exists():
        return None
    try:
        document = json.loads(run.rules_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RunFolderError(f"cannot read {run.rules_path}: {error}") from error
    if not isinstance(document, dict):
        raise RunFolderError(f"{run.rules_path} is not a rules file (a JSON object with a list of rules)")
    return document


def _read_metrics(run: RunFolder, notes: list[str]) -> dict[str, Any] | None:
    if not run.metrics_path.exists():
        return None
    try:
        metrics = json.loads(run.metrics_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        # The curves are a nicety; the rules are the point of the report.
        notes.append(f"cannot read {run.metrics_path} ({error}): the report has no training curves or lineage")
        return None
    return metrics if isinstance(metrics, dict) else None


def _evaluate(data: ProfileData, parameters: Mapping[str, Mapping[str, Any]] | None) -> list[RuleEvaluation]:
    try:
        return rules.evaluate(data, parameters)
    except ValueError as error:  # an unknown rule or parameter, named by `rules`
        raise RunFolderError(f"cannot evaluate the rules: {error}") from error


def _newest(data: ProfileData) -> float | None:
    """The newest moment the profile holds: a sample's time or a step's end."""
    span = data.system.time_range()
    ends = data.steps.column("start") + data.steps.column("duration")
    newest = [span[1]] if span else []
    if len(ends):
        newest.append(float(ends.max()))
    return max(newest, default=None)


def _stale_note(document: Mapping[str, Any], data: ProfileData, run: RunFolder) -> str | None:
    newest = _newest(data)
    try:
        written = datetime.fromisoformat(str(document["generated_at"])).timestamp()
    except (KeyError, ValueError):
        return None
    if newest is None or newest - written <= STALE_AFTER_SECONDS:
        return None
    clock = "%H:%M:%S"
    return (
        f"{run.rules_path} was written at {datetime.fromtimestamp(written, UTC):{clock}} UTC but "
        f"{run.profile_dir} goes on until {datetime.fromtimestamp(newest, UTC):{clock}} UTC "
        f"({newest - written:.0f} s later; the run stopped before its final evaluation?): the "
        "verdicts shown cover only part of the run; re-evaluate to judge all of it with the "
        "run's parameters"
    )


def _started_at(recorded: list[RuleEvaluation], data: ProfileData) -> float | None:
    """The job's start, from the recorded MaxInitializationTime: first step minus its wait."""
    starts = data.steps.column("start")
    for result in recorded:
        waited = result.evidence.get("initialization_seconds")
        seen = result.evidence.get("first_step_seen")
        if result.name == "MaxInitializationTime" and seen and len(starts) and isinstance(waited, int | float):
            return float(starts.min()) - float(waited)
    return None


def _carry_stop_note(recorded: list[RuleEvaluation], results: list[RuleEvaluation]) -> None:
    """The rule that stopped the run still says so: only the training loop knew it."""
    stopped = {r.name for r in recorded if r.evidence.get("stopped_training") is True}
    for result in results:
        if result.name in stopped:
            result.stopped_training()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m trainer.profiling.rerender OUTPUT_DIR`: re-evaluate and re-render a run.

    The rules run again on everything under `profile/` with the parameters the run's own
    `rules.json` records (see `load`), so a run started with `--rule-parameters` keeps them;
    without a `rules.json` the defaults are used and stderr says so. Both files are rewritten
    in `--out` (default OUTPUT_DIR): this is the trainer's own final step, done again, e.g. for
    a run that died before it. `retrain report` renders a copy instead and touches nothing.
    """
    parser = argparse.ArgumentParser(description=main.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output_dir", type=Path, help="the run's output folder (holds profile/), or profile/")
    parser.add_argument("-o", "--out", type=Path, help="folder for rules.json and report.html")
    parser.add_argument("--metrics", type=Path, help="metrics.json (default: OUTPUT_DIR's)")
    parser.add_argument("--job-name", help="the report's job name (default: the one rules.json records)")
    args = parser.parse_args(argv)
    try:
        run = find_run(args.output_dir)
        if args.metrics:
            run = RunFolder(run.output_dir, metrics_file=args.metrics)
        rendered = load(run, re_evaluate=True, job_name=args.job_name)
    except RunFolderError as error:
        parser.error(str(error))  # exits 2, with the usage line
    for note in rendered.notes:
        print(f"note: {note}", file=sys.stderr)
    _, page = report.write_outputs(
        args.out or run.output_dir,
        rendered.data,
        rendered.results,
        job_name=rendered.job_name,
        metrics=rendered.metrics,
    )
    print(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
