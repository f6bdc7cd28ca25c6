"""`retrain report PROFILE_DIR [-o report.html]`: a run's profiling report, rendered again.

PROFILE_DIR is what the trainer leaves in its output folder (`profile/`, `rules.json`,
`metrics.json`; `retrain train` puts it in OUT/output): that folder, its `profile/` folder, or the
`retrain train --out` folder. The report goes to `-o` alone: the run's folder is only read, so
its `rules.json` stays what the notifications and the quality gate read.

The verdicts are the run's own, from its `rules.json` (see `trainer.profiling.rerender` for why
they are not re-evaluated by default). `--re-evaluate` runs the rules again on all of `profile/`
with the parameters the run used; `--rule-parameters` changes some of them for this report
only. Without a `rules.json` the rules are evaluated with their defaults, and stderr says so.

`--json` prints what was rendered as one document (`RenderedReport`: the report's path and
file URL, the run's folder, how the verdicts were reached, every rule's verdict, the issues).

Exit codes: 0 the report written; 2 usage error (not a run's folder, an unreadable rules.json,
an `-o` that would overwrite the run's data, an unwritable `-o`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.text import Text

from functions.common import rules
from functions.common.rules import RuleResult, parse_rules_file
from retrain.commands.extras import require
from retrain.commands.options import JsonOption, print_json

if TYPE_CHECKING:
    from trainer.profiling import rerender

errors = Console(stderr=True)


class RenderedReport(BaseModel):
    """What `retrain report` wrote, and the verdicts it shows."""

    report: Path
    url: str  # the report as a file:// URL, to open in a browser
    run_folder: Path  # the run's output folder, only read
    job_name: str | None
    verdicts: str  # "recorded" (the run's own), "re-evaluated" (with its parameters) or "defaults"
    summary: str  # the rules in one line, as the run's notification says it
    issues: list[str]  # the rules that found issues
    rules: list[RuleResult]
    notes: list[str]  # caveats (defaults used, verdicts older than the run's end...), also on stderr


def command(
    profile_dir: Annotated[
        Path,
        typer.Argument(
            metavar="PROFILE_DIR",
            help="The run's output folder (holding profile/ and rules.json), or its profile/ folder.",
        ),
    ],
    *,
    out: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--out",
            help="The report file (default ./report.html); a folder means FOLDER/report.html.",
            show_default=False,
        ),
    ] = None,
    re_evaluate: Annotated[
        bool,
        typer.Option(help="Evaluate the rules again on all of profile/, with the run's parameters."),
    ] = False,
    rule_parameters: Annotated[
        str | None,
        typer.Option(
            help='Per-rule overrides as JSON, e.g. \'{"DataStall": {"threshold": 0.3}}\' (implies --re-evaluate).'
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Render a run's profiling report to a file, keeping the run's rule parameters and verdicts."""
    require("trainer", "report", modules=("numpy",))
    from trainer.profiling import report, rerender  # noqa: PLC0415 (numpy: not for `retrain --help`)

    overrides = _overrides(rule_parameters)
    try:
        run = rerender.find_run(profile_dir)
    except rerender.RunFolderError as error:
        _fail(str(error), error)
    target = _target(out, run)
    try:
        # Reading hours of 100 ms samples takes a while: say what is happening meanwhile.
        with errors.status(f"reading {run.profile_dir}"):
            rendered = rerender.load(run, re_evaluate=re_evaluate, overrides=overrides)
            page = rendered.html()
    except rerender.RunFolderError as error:
        _fail(str(error), error)
    for note in rendered.notes:
        errors.print(Text.assemble(("note: ", "yellow"), note), soft_wrap=True)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        report.write_atomic(target, page)
    except OSError as error:
        _fail(f"cannot write the report: {error}", error)
    result = _result(rendered, run, target)
    errors.print(Text(f"{result.summary} ({_HOW[result.verdicts]})"), soft_wrap=True)
    if as_json:
        print_json(result)
        return
    typer.echo(f"report: {result.report}")
    typer.echo(result.url)


def _fail(message: str, cause: Exception | None = None) -> NoReturn:
    """An expected condition (a wrong folder, a bad flag): one line on stderr, exit 2."""
    # Text, not markup: a path may well hold brackets.
    errors.print(Text.assemble(("error: ", "bold red"), message), soft_wrap=True)
    raise typer.Exit(2) from cause


def _overrides(text: str | None) -> dict[str, dict[str, Any]] | None:
    """--rule-parameters, as the trainer's flag of that name takes it."""
    if not text:
        return None
    try:
        overrides = json.loads(text)
    except json.JSONDecodeError as error:
        _fail(f"--rule-parameters is not JSON: {error}", error)
    if not isinstance(overrides, dict) or not all(isinstance(v, dict) for v in overrides.values()):
        _fail('--rule-parameters must map rule names to {parameter: value}, e.g. {"DataStall": {"threshold": 0.3}}')
    return overrides


def _target(out: Path | None, run: rerender.RunFolder) -> Path:
    """Where the report goes; never over the run's data, and over its report only when asked."""
    from trainer.profiling import report  # noqa: PLC0415

    target = out if out is not None else Path(report.REPORT_FILE)
    if target.is_dir():
        target = target / report.REPORT_FILE
    target = target.resolve()  # a symlink into the run's folder is the run's folder
    profile = run.profile_dir.resolve()
    if target in {path.resolve() for path in run.protected()} or target.is_relative_to(profile):
        _fail(f"-o {target} is part of the run's own data: write the report anywhere else")
    if target == run.report_path.resolve() and out is None:
        # From inside the run's folder the default would silently replace the trainer's report.
        _fail(
            f"the default -o ./{report.REPORT_FILE} is the run's own report here ({target}): pass "
            f"-o {report.REPORT_FILE} to replace it, or -o with another path"
        )
    return target


_HOW = {
    "recorded": "the run's recorded verdicts",
    "re-evaluated": "re-evaluated with the run's parameters",
    "defaults": "evaluated with the default parameters",
}


def _result(rendered: rerender.Rendered, run: rerender.RunFolder, target: Path) -> RenderedReport:
    from trainer.profiling import report  # noqa: PLC0415

    # The rules as rules.json has them, and in the same words as the run's notification
    # (functions/common/rules.py).
    found = parse_rules_file(json.dumps(report.rules_document(rendered.results))).rules
    issues = [rule.name for rule in found if rules.verdict(rule) == rules.ISSUES]
    line = rules.summary_line(found, "builtin") or "no rules"
    if issues:
        line += f"; issues found: {', '.join(issues)}"
    return RenderedReport(
        report=target,
        url=target.as_uri(),
        run_folder=run.output_dir,
        job_name=rendered.job_name,
        verdicts=rendered.verdicts,
        summary=line,
        issues=issues,
        rules=found,
        notes=rendered.notes,
    )
