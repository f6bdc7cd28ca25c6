"""`make run`: the whole loop on this machine, shown stage by stage as it happens.

It starts the offline stack, draws synthetic street scenes with a handful of broken files among
them, uploads them as an annotation team would, and follows what the system does with them: the
intake's verdict on every object, the batch closing and its report, the dataset version frozen,
the FSx import, the training job's epochs (read from its CloudWatch log stream, as one watches a
SageMaker job), the profiler rules, the evaluation and the quality gate's decision, and the
messages sent to the team. It ends with where to look: the run's files copied to a local folder
(the report opens in a browser straight from disk), their `s3://` locations, and the file that
holds what the functions logged (their JSON logs and EMF metrics, kept out of the story).
"""

from __future__ import annotations

import io
import json
import logging
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from functions.common import prefixes, rules
from functions.common.contracts import parse_manifest
from functions.common.models import RunState
from functions.common.summary import RunSummary
from retrain.local.cloudformation.stack import OFFLINE_TRAINING, TERMINAL, OfflineStack, StackOptions
from retrain.local.events.notifications import TopicInbox
from retrain.runs import run_state
from retrain.synth import write_scenes

if TYPE_CHECKING:
    from collections.abc import Callable

FINAL = {"curated", "quarantined", "duplicate", "superseded", "marker", "refused"}
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
BROKEN = 5  # objects the demo breaks on purpose (see `_files`)
# The two teams: the first drop trains the first model, which then screens the second's labels.
FIRST_TEAM, SECOND_TEAM = "munich", "berlin"
# How the second team's annotation tool was misconfigured for part of its export.
WRONG_CLASS_MAP = {"road": "sky", "sky": "road", "building": "vegetation", "vegetation": "building"}
# The second run fine-tunes the accepted model (it starts from its weights): fewer epochs do.
LATER_EPOCHS = 2
# A first model that learns the big classes in seconds, enough to judge them (screening judges a
# class only where the model's IoU reaches 0.3).
HYPERPARAMETERS = {"workers": 0, "lr": 0.05, "class-weighting": "balanced"}
VERDICT_STYLES = {rules.ISSUES: "yellow", rules.PASSED: "green", rules.NOT_APPLICABLE: "dim", rules.ERROR: "red"}


@dataclass(frozen=True)
class DemoOptions:
    count: int = 200  # the first team's scenes; the second drops a fifth as many (at least 10)
    # Small scenes, whole: a first model that judges road, sky, building and vegetation (IoU of
    # 0.3 and more) after 8 epochs of about 3 s, and an intake of small objects.
    size: tuple[int, int] = (128, 64)
    epochs: int = 8
    processes: int = 1  # emulated training hosts, one process each
    out: Path = Path("retrain-demo")
    timeout: float = 600.0

    def parameters(self) -> dict[str, str]:
        """The stack's template parameters for a demo: a run starts as soon as the batch closes
        (production: 500 pairs or 6 hours, and a minute for late events to settle), and trains
        for real in about a minute (`OFFLINE_TRAINING`: CPU hosts, a narrow model, small crops)."""
        width, height = self.size
        return {
            **OFFLINE_TRAINING,
            "MinNewPairs": "1",
            "SettleSeconds": "0",
            "PollSeconds": "1",
            "PollMaxSeconds": "2",
            "TrainingInstanceCount": str(self.processes),
            "TrainingEpochs": str(self.epochs),
            "TrainingCrop": f"{min(width, 128)}x{min(height, 64)}",
            "TrainingBatchSize": "8",
            "TrainingExtraHyperparameters": json.dumps(HYPERPARAMETERS),
        }

    @property
    def second_count(self) -> int:
        return max(10, self.count // 5)

    @property
    def swapped(self) -> int:
        """The second drop's pairs with the wrong class map: a minority (15 %), fewer than a fifth
        of the batch, so the screen leaves them out rather than holding the batch whole."""
        return max(2, self.second_count * 3 // 20)


@dataclass(frozen=True)
class Place:
    """A file or folder "Where to look" names, and its S3 location (None: only here)."""

    what: str
    path: Path
    s3_uri: str | None = None


@dataclass
class DemoResult:
    """How the demo ended: what its closing lines say (`retrain local demo --json` prints it)."""

    ok: bool
    run: str | None = None  # the last run followed: the second (screening) run when both ended
    summary: RunSummary | None = None  # that run's summary.json
    local_folder: Path | None = None  # where that run's files were copied
    report: Path | None = None  # its profiling report, copied here
    problems: list[str] = field(default_factory=list)
    first_run: str | None = None  # the run that trained the first model
    batches: list[str] = field(default_factory=list)  # the teams' drops, in the order they came
    bucket: str | None = None
    function_log: Path | None = None  # what the functions logged (JSON logs, EMF metrics)
    places: list[Place] = field(default_factory=list)  # "Where to look", line by line


class Demo:
    """`console` is bound to its stream (`Console(file=...)`): while a function runs in this
    process, `sys.stdout` is the functions' log (`StackOptions.function_log`)."""

    def __init__(self, options: DemoOptions, console: Console) -> None:
        self.options = options
        self.console = console
        self.summary: RunSummary | None = None
        self._run = ""
        self._runs: set[str] = set()  # the executions already followed
        self._rules_shown = False
        self._first = True  # following the first run
        self._slack_seen = 0  # Slack messages of earlier runs, already told by their subject

    def run(self) -> DemoResult:
        logging.getLogger("moto").setLevel(logging.CRITICAL)
        warnings.filterwarnings("ignore", message="No application metrics to publish")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        # The functions log and emit metrics as on AWS (JSON lines on stdout, which CloudWatch
        # Logs keeps); that goes to this file, and the stages below say what happened.
        self.function_log = (self.options.out / "logs" / f"demo-{stamp}.log").resolve()
        options = StackOptions(
            mode="server",
            parameters=self.options.parameters(),
            function_log=self.function_log,
            # Two execution environments per function, in worker processes, as Lambda scales a
            # function out: the intake's two SQS pollers check objects on both cores.
            lambda_concurrency=2,
        )
        started = time.monotonic()
        self._stage("Starting the offline stack (moto, the real functions and state machine, emulated FSx/SageMaker)")
        with OfflineStack(options) as stack:
            self.stack = stack
            self.bucket = stack.created.outputs["DataBucketName"]
            self.console.print(f"  AWS endpoint {stack.endpoint_url}, data bucket s3://{self.bucket}", soft_wrap=True)
            inbox = stack.topic_inbox("demo-inbox")
            result = self._play(stamp, inbox)
            result.bucket, result.function_log = self.bucket, self.function_log
        if result.run is None:  # "Where to look" names it otherwise
            self.console.print(f"  What the functions logged: {self.function_log}", soft_wrap=True)
        self.console.print(
            f"Offline stack stopped; nothing left running. The demo took {time.monotonic() - started:.0f} s."
        )
        return result

    # -------------------------------------------------------------- stages --
    def _stage(self, text: str) -> None:
        self.console.print(f"\n[bold cyan]>[/bold cyan] [bold]{text}[/bold]", soft_wrap=True)

    def _play(self, stamp: str, inbox: TopicInbox) -> DemoResult:
        first, second = f"{FIRST_TEAM}-{stamp}", f"{SECOND_TEAM}-{stamp}"
        self._chapter(f"Team {FIRST_TEAM}'s first drop: the first model")
        problems, _ = self._drop(first, self._draw)
        run, summary = self._retrain()
        if summary is None or run is None:
            why = f"the first run did not end: {self._why_no_run()}"
            return DemoResult(ok=False, problems=[*problems, why], batches=[first])
        first_run = run
        if summary.outcome != "accepted":
            problems.append(f"the first run ended {summary.outcome}")
            return DemoResult(ok=False, run=run, summary=summary, problems=problems, first_run=run, batches=[first])
        self._messages(inbox, full=False)

        # The accepted model now judges every new pair's labels before anything trains on them.
        self._first = False
        self.stack.update_function_environment(
            "TrainingJobFunction",
            TRAINING_EXTRA_HYPERPARAMETERS=json.dumps({**HYPERPARAMETERS, "epochs": LATER_EPOCHS}),
        )
        self._chapter(f"Team {SECOND_TEAM}'s drop: part of it exported with the wrong class map")
        more, report = self._drop(second, self._draw_second)
        problems += more
        run, summary = self._retrain()
        if summary is None or run is None:
            why = f"the second run did not end: {self._why_no_run()}"
            return DemoResult(ok=False, problems=[*problems, why], first_run=first_run, batches=[first, second])
        self._messages(inbox, full=True)
        folder, report_path, places = self._where_to_look(run, summary, report, screened=second)
        if not (summary.left_out.get(second, 0) > 0 or second in summary.held):
            # Not a failure of the loop: a first model too weak to judge (smaller --count or
            # --epochs than the defaults) sees nothing, and says so in the screening line above.
            self.console.print(
                f"  [yellow]the screen did not flag {second}'s wrong class map: the first model judges a class "
                "only where its IoU reaches 0.3; more --epochs or --count make it a judge[/yellow]",
                soft_wrap=True,
            )
        return DemoResult(
            ok=not problems,
            run=run,
            summary=summary,
            local_folder=folder,
            report=report_path,
            problems=problems,
            first_run=first_run,
            batches=[first, second],
            places=places,
        )

    def _chapter(self, text: str) -> None:
        self.console.rule(f"[bold]{text}[/bold]")

    def _drop(
        self, batch: str, draw: Callable[[Path], list[tuple[str, bytes]]]
    ) -> tuple[list[str], dict[str, Any] | None]:
        """A team's drop, from drawing to its closed batch report; the problems seen on the way."""
        with tempfile.TemporaryDirectory() as folder:
            keys = self._upload(batch, draw(Path(folder)))
        fates = self._intake(batch, keys)
        curated_pairs = sum(fate["status"] == "curated" for fate in fates.values()) // 2
        report = self._batch_report(batch, curated_pairs)
        missing = len(keys) - len(fates)
        return ([f"{missing} objects of {batch} not accounted for"] if missing else []), report

    def _retrain(self) -> tuple[str | None, RunSummary | None]:
        """The run the closed batch starts, followed to its end: its name and summary."""
        execution = self._wait_for_run()
        if execution is None:
            return None, None
        run = self._run = execution["name"]
        self.summary = None
        self._follow(execution["executionArn"])
        return run, self.summary or self._summary(run)

    def _why_no_run(self) -> str:
        return self._trigger_declined() or "no retraining run started"

    def _draw(self, folder: Path) -> list[tuple[str, bytes]]:
        count, size = self.options.count, self.options.size
        self._stage(f"Drawing {count} synthetic street scenes ({size[0]}x{size[1]}), {BROKEN} of the files broken")
        with self._progress(spinner=True) as progress:
            progress.add_task("drawing scenes", total=None)
            pairs = write_scenes(folder, count=count, size=size, seed=0)
        files = _files(pairs)
        self.console.print(
            "  broken on purpose: a mask with an unknown class id, a truncated photo, a mask of the wrong "
            "size, a photo uploaded twice under another name, and the annotators' notes.txt",
            soft_wrap=True,
        )
        return files

    def _draw_second(self, folder: Path) -> list[tuple[str, bytes]]:
        count, swapped, size = self.options.second_count, self.options.swapped, self.options.size
        self._stage(
            f"Drawing {count} scenes of other streets; {swapped} of their masks with road and sky, "
            "building and vegetation exchanged"
        )
        with self._progress(spinner=True) as progress:
            progress.add_task("drawing scenes", total=None)
            wrong = write_scenes(folder / "wrong", count=swapped, size=size, seed=1, class_map=WRONG_CLASS_MAP)
            right = write_scenes(folder / "right", count=count - swapped, size=size, seed=2)
        self.console.print(
            "  a misconfigured export: valid files, wrong labels. Every validation check passes them; "
            f"only a model can see it: {', '.join(image.stem for image, _ in wrong)}",
            soft_wrap=True,
        )
        files = [
            (f"{kind}/{path.name}", path.read_bytes())
            for pair in [*wrong, *right]
            for kind, path in zip(("images", "labels"), pair, strict=True)
        ]
        return [*files, ("_COMPLETE", b"")]

    def _upload(self, batch: str, files: list[tuple[str, bytes]]) -> list[str]:
        self._stage(f"Uploading to s3://{self.bucket}/incoming/{batch}/ as an annotation team would")
        s3 = self.stack.aws.s3
        keys = []
        with self._progress() as progress:
            task = progress.add_task("uploading", total=len(files))
            for relative, body in files:
                key = f"{prefixes.INCOMING}{batch}/{relative}"
                s3.put_object(Bucket=self.bucket, Key=key, Body=body)
                keys.append(key)
                progress.advance(task)
        self.console.print(f"  {len(keys)} objects, the last one the batch's _COMPLETE marker")
        return keys

    def _progress(self, *, spinner: bool = False) -> Progress:
        """A bar (or a spinner) that leaves sys.stdout alone: rich's live displays take it over in
        a terminal, and a function running in this process swaps it for the functions' log; two
        threads swapping one stream would leave it pointing at the wrong place."""
        if spinner:
            columns: tuple[ProgressColumn, ...] = (SpinnerColumn(), TextColumn("{task.description}"))
        else:
            columns = (TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        return Progress(*columns, console=self.console, transient=True, redirect_stdout=False)

    def _intake(self, batch: str, keys: list[str]) -> dict[str, dict[str, Any]]:
        self._stage("Intake: S3 event -> SQS -> intake Lambda validates every object -> ledger")
        deadline = time.monotonic() + self.options.timeout
        fates: dict[str, dict[str, Any]] = {}
        with self._progress() as progress:
            task = progress.add_task("objects checked", total=len(keys))
            while time.monotonic() < deadline:
                # A count while the intake works (moto would serialize every record of a full
                # read in the process the intake runs in), the records once all are settled.
                settled = self._settled(batch)
                progress.update(task, completed=min(settled, len(keys)))
                if settled >= len(keys):
                    fates = {k: f for k, f in self._fates(batch).items() if f["status"] in FINAL}
                    if len(fates) >= len(keys):
                        break
                time.sleep(0.5)
        counts: dict[str, int] = {}
        for fate in fates.values():
            counts[fate["status"]] = counts.get(fate["status"], 0) + 1
        self.console.print(
            f"  {len(fates)} of {len(keys)} objects checked: "
            + ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        )
        table = Table(title="Not curated, and why", title_justify="left", show_edge=False)
        for column in ("object", "fate", "reason"):
            table.add_column(column)
        for key, fate in sorted(fates.items()):
            if fate["status"] in {"quarantined", "duplicate"}:
                why = "; ".join(f"{r['code']}: {r.get('message', '')}" for r in fate.get("reasons", []))
                table.add_row(key.rsplit("/", 2)[-2] + "/" + key.rsplit("/", 1)[-1], fate["status"], why or "-")
        self.console.print(table)
        return fates

    def _settled(self, batch: str) -> int:
        """Objects of the batch with their fate (superseded versions aside): a count, no records."""
        final = sorted(FINAL - {"superseded"})
        pages = self.stack.aws.dynamodb.get_paginator("query").paginate(
            TableName=self.stack.ref("LedgerTable"),
            KeyConditionExpression="pk = :pk AND begins_with(sk, :files)",
            FilterExpression="#status IN (" + ", ".join(f":s{i}" for i in range(len(final))) + ")",
            ExpressionAttributeNames={"#status": "status"},
            ExpressionAttributeValues={
                ":pk": {"S": f"batch#{batch}"},
                ":files": {"S": "file#"},
                **{f":s{i}": {"S": status} for i, status in enumerate(final)},
            },
            Select="COUNT",
        )
        return sum(page["Count"] for page in pages)

    def _fates(self, batch: str) -> dict[str, dict[str, Any]]:
        pages = self.stack.aws.dynamodb.get_paginator("query").paginate(
            TableName=self.stack.ref("LedgerTable"),
            KeyConditionExpression="pk = :pk AND begins_with(sk, :files)",
            ExpressionAttributeValues={":pk": {"S": f"batch#{batch}"}, ":files": {"S": "file#"}},
        )
        fates: dict[str, dict[str, Any]] = {}
        for page in pages:
            for item in page["Items"]:
                record = json.loads(item["record"]["S"])
                if record["status"] != "superseded":
                    fates[record["key"]] = record
        return fates

    def _batch_report(self, batch: str, pairs: int) -> dict[str, Any] | None:
        """The batch's report once it is closed and counts its `pairs` (the marker may close the
        batch before its last pairs are curated; each of them rewrites the report)."""
        key = prefixes.report_key(batch, "report.json")

        def ready(doc: dict[str, Any]) -> bool:
            return doc.get("status") == "closed" and len(doc.get("accepted", [])) >= pairs

        report = self._wait_json(key, ready, timeout=60)
        if report is None:
            self.console.print(f"  [red]batch {batch} has no closed report at s3://{self.bucket}/{key}[/red]")
            return None
        self._stage(f"Batch {batch} closed ({report.get('closed_by') or 'marker'}) and reported")
        rejected = sum(len(items) for items in report.get("rejected", {}).values())
        self.console.print(
            f"  {len(report.get('accepted', []))} pairs accepted, {rejected} files rejected, "
            f"{len(report.get('duplicates', []))} duplicate files; "
            f"s3://{self.bucket}/{prefixes.report_key(batch, 'report.md')}",
            soft_wrap=True,
        )
        return report

    def _wait_json(self, key: str | tuple[str, ...], ready: Any, timeout: float) -> dict[str, Any] | None:
        """The first of `key` (one, or several in order of preference) that is there and ready."""
        s3 = self.stack.aws.s3
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for one in (key,) if isinstance(key, str) else key:
                try:
                    document: dict[str, Any] = json.loads(s3.get_object(Bucket=self.bucket, Key=one)["Body"].read())
                except s3.exceptions.NoSuchKey:
                    document = {}
                if document and ready(document):
                    return document
            time.sleep(0.3)
        return None

    def _wait_for_run(self) -> dict[str, Any] | None:
        sfn = self.stack.aws.stepfunctions
        machine = self.stack.ref("RetrainStateMachine")
        # A look can decline before the batch's last pairs are curated (its marker came first); they
        # ask for another. Only a minute with no run says the trigger decided to wait.
        deadline = time.monotonic() + 60
        with self._progress(spinner=True) as progress:
            progress.add_task("waiting for the trigger to freeze a dataset version and start a run", total=None)
            while time.monotonic() < deadline:
                runs = [
                    r for r in sfn.list_executions(stateMachineArn=machine)["executions"] if r["name"] not in self._runs
                ]
                if runs:
                    self._runs.add(runs[0]["name"])
                    return dict(runs[0])
                time.sleep(0.3)
        return None

    def _trigger_declined(self) -> str | None:
        looks = [i for i in self.stack.runtime.invocations if i.function.endswith("TriggerFunction") and not i.failed]
        if not looks or looks[-1].payload.get("started"):
            return None
        return str(looks[-1].payload.get("reason"))

    # ------------------------------------------------------------ the run --
    def _follow(self, execution_arn: str) -> None:
        """Print the run's stages from its history, and the job's epochs from its log stream."""
        sfn = self.stack.aws.stepfunctions
        seen = 0
        job: str | None = None
        tail = _LogTail(self.stack.aws.logs)
        last_status: tuple[str, str | None] | None = None
        deadline = time.monotonic() + self.options.timeout
        while time.monotonic() < deadline:
            events = self.stack.history(execution_arn)
            for event in events[seen:]:
                job = self._narrate(event, job) or job
                exited = event.get("stateExitedEventDetails")
                if exited and exited["name"] == "Wait for the training job to end":
                    state = run_state(exited.get("output")) or RunState()
                    if state.job is not None and (state.job.status, state.job.secondary_status) != last_status:
                        last_status = (state.job.status, state.job.secondary_status)
                        self.console.print(f"  training job {state.job.status} ({state.job.secondary_status})")
            seen = len(events)
            if job is not None:
                for line in tail.new_lines(job):
                    self._epoch(line)
            status = sfn.describe_execution(executionArn=execution_arn)["status"]
            if status in TERMINAL:
                if job is not None:
                    for line in tail.new_lines(job):
                        self._epoch(line)
                colour = "green" if status == "SUCCEEDED" else "red"
                self.console.print(f"  execution [{colour}]{status}[/{colour}]")
                return
            time.sleep(0.5)
        self.console.print(f"  [red]the run did not end within {self.options.timeout:.0f} s[/red]")

    def _narrate(self, event: dict[str, Any], job: str | None) -> str | None:
        """One line per stage as its state ends; returns the job's name once it exists."""
        entered = event.get("stateEnteredEventDetails")
        if entered and entered["name"] == "Stop the training job if one was created":
            # The failure branch's first state: the run failed (the message says where and why).
            self.console.print("  [red]the run failed: its failure branch stops the job and tells the team[/red]")
            return None
        exited = event.get("stateExitedEventDetails")
        if not exited:
            return None
        name, state = exited["name"], run_state(exited.get("output")) or RunState()
        run = state.run
        if name == "Check that the dataset version exists" and run is not None:
            self._stage(f"Dataset version {run.dataset_version} frozen; retraining run {run.run} started")
            self.console.print(f"  {self._splits(run.manifest_uri)}, manifest {run.manifest_uri}", soft_wrap=True)
            baseline = f"accepted model of run {run.accepted.run}" if run.accepted else "no accepted model yet"
            self.console.print(f"  compared with: {baseline}")
        elif name == "Copy the dataset to FSx" and state.sync is not None:
            self._stage(f"FSx for Lustre: import task {state.sync.task_id} on {state.sync.file_system_id}")
        elif name == "Check the FSx import" and state.sync is not None and state.sync.done:
            files = f", {state.sync.files} files" if state.sync.files is not None else ""
            self.console.print(f"  import {state.sync.lifecycle}{files}")
        elif name == "Start training" and state.job is not None:
            options = self.options
            self._stage(f"SageMaker training job {state.job.job_name}")
            epochs = f"{options.epochs} epochs" if self._first else f"{LATER_EPOCHS} epochs from the accepted model"
            self.console.print(
                f"  {options.processes} x ml.m5.xlarge (emulated: torchrun on this machine), {epochs}, "
                "profiling on; epochs as the job's CloudWatch log stream reports them:",
                soft_wrap=True,
            )
            return state.job.job_name
        elif name == "Check the profiler rules" and state.job is not None and state.job.phase == "done":
            self.console.print("  Debugger's rule evaluations have ended")
        elif name == "Evaluate the run":
            self._stage("Evaluation and the quality gate")
            self.summary = self._summary(self._run)
        elif name == "Tell the team how the run went":
            self._stage("The team is told (SNS e-mail and Slack)")
        elif name == "Release the lock and look for new data":
            self.console.print("  lock released; the trigger looked for newer data")
        return job

    def _splits(self, manifest_uri: str) -> str:
        bucket, key = prefixes.split_s3_uri(manifest_uri)
        entries = parse_manifest(self.stack.aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode())
        train = sum(1 for e in entries if e.split == "train")
        return f"{len(entries)} pairs ({train} train, {len(entries) - train} validation)"

    def _epoch(self, line: str) -> None:
        if not line.startswith("METRIC "):
            return
        values = dict(part.split("=", 1) for part in line.removeprefix("METRIC ").split() if "=" in part)
        if "epoch" in values and "val_miou" in values:
            total = self.options.epochs if self._first else LATER_EPOCHS
            self.console.print(
                f"  epoch {values['epoch']}/{total}: train loss {float(values['train_loss']):.3f}, "
                f"val mIoU {float(values['val_miou']):.3f}, {float(values.get('images_per_sec', 0)):.0f} images/s, "
                f"data stall {float(values.get('stall_fraction', 0)):.0%}, "
                f"{float(values.get('epoch_seconds', 0)):.1f} s"
            )
        elif "baseline_miou" in values:
            self.console.print(
                f"  the accepted model on this validation split: mIoU {float(values['baseline_miou']):.3f}"
            )

    def _screening(self, summary: RunSummary) -> None:
        """The run's first phase: the accepted model's verdict on the new batches' labels."""
        screening = summary.screening
        if screening is None:
            return
        if not screening.screened:
            self.console.print(f"  label screening: {screening.why} (every batch is trained on)")
            return
        self.console.print(
            f"  label screening ({screening.calibration or 'calibrated'}): every new pair judged; "
            f"{len(screening.held)} batch(es) held, {screening.left_out} pair(s) left out"
        )
        for batch, reasons in summary.held.items():
            self.console.print(f"    [yellow]{batch}[/yellow]: {reasons[0] if reasons else 'held'}", soft_wrap=True)
            self.console.print(f'      let it in if its labels are right: retrain data release {batch} --reason "..."')
        for batch, count in summary.left_out.items():
            self.console.print(
                f"    {batch}: {count} pair(s) to fix: reports/batches/{batch}/report.md", soft_wrap=True
            )
        for batch, reasons in summary.disputed.items():
            self.console.print(f"    [yellow]{batch}[/yellow]: {reasons[0] if reasons else 'disputed'}", soft_wrap=True)
        for batch in summary.not_judged:
            self.console.print(f"    {batch}: not judged (scenes the model does not know): trained on, not trusted")

    def _summary(self, run: str) -> RunSummary | None:
        document = self._wait_json(prefixes.summary_keys(run), lambda doc: True, timeout=10)
        if document is None:
            self.console.print(f"  [red]run {run} wrote no summary.json[/red]")
            return None
        summary = RunSummary.model_validate(document)
        self._screening(summary)
        if summary.gate is not None:
            verdict = "[green]accepted[/green]" if summary.gate.accepted else "[yellow]rejected[/yellow]"
            change = f" ({summary.gate.miou_change:+.3f})" if summary.gate.miou_change is not None else ""
            miou = f"{summary.miou:.3f}" if summary.miou is not None else "unknown"
            self.console.print(f"  mIoU {miou}{change}: the gate {verdict} the model")
            for reason in summary.gate.reasons:
                self.console.print(f"    - {reason}", soft_wrap=True)
        elif summary.error:
            self.console.print(f"  [red]{summary.outcome} at {summary.failed_state}: {summary.error}[/red]")
            self.console.print(f"    {summary.cause or ''}", soft_wrap=True, markup=False)
        if summary.rules and self._rules_shown:
            issues = [rule.name for rule in summary.rules if rules.verdict(rule) == rules.ISSUES]
            self.console.print(f"  profiler rules: {', '.join(issues) or 'no'} issues found (the report has them all)")
        elif summary.rules:
            self._rules_shown = True
            table = Table(title=f"Profiler rules ({summary.rules_backend})", title_justify="left", show_edge=False)
            for column in ("rule", "verdict", "what to do"):
                table.add_column(column, overflow="fold")
            for rule in summary.rules:
                # The notification's words (functions/common/rules.py), in the notification's colours.
                said = rules.verdict(rule)
                table.add_row(rule.name, f"[{VERDICT_STYLES.get(said, 'bold')}]{said}[/]", rules.advice(rule))
            self.console.print(table)
        return summary

    def _messages(self, inbox: TopicInbox, *, full: bool) -> None:
        """The run's messages: in full, or (the first run's) by their subject."""
        deadline = time.monotonic() + 10
        emails: list[dict[str, Any]] = []
        while not emails and time.monotonic() < deadline:
            emails = inbox.receive()
        if not full:
            for email in emails:
                self.console.print(f"  E-mail (SNS), subject: {email.get('Subject', '')}", soft_wrap=True)
            self.console.print("  (the second run's messages are shown in full below)")
            if self.stack.slack is not None:
                self._slack_seen = len(self.stack.slack.messages)
            return
        for email in emails:
            self.console.print(f"\n[bold]E-mail (SNS)[/bold], subject: {email.get('Subject', '')}", soft_wrap=True)
            self.console.print(email["Message"], soft_wrap=True, markup=False, highlight=False)
        for posted in self.stack.slack.messages[self._slack_seen :] if self.stack.slack else []:
            self.console.print(f"\n[bold]Slack[/bold] ({len(posted.get('blocks', []))} Block Kit blocks):")
            self.console.print(_slack_as_text(posted), soft_wrap=True, markup=False, highlight=False)
        if self.stack.slack is not None:
            self._slack_messages = list(self.stack.slack.messages)

    def _where_to_look(
        self, run: str, summary: RunSummary | None, report: dict[str, Any] | None, *, screened: str
    ) -> tuple[Path, Path | None, list[Place]]:
        """Copy the run's folder and model here, and the screened batch's relabel list and its
        pictures, and say where everything is: the run's folder, its report, and the places named."""
        folder = (self.options.out / run).resolve()
        batch_folder = (self.options.out / screened).resolve()
        s3 = self.stack.aws.s3
        copied = []
        for prefix in (prefixes.run_report_key(run, ""), f"models/runs/{run}/", prefixes.report_key(screened, "")):
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                for item in page.get("Contents", []):
                    name = item["Key"].removeprefix(prefix)
                    if prefix.startswith("models/"):
                        target = folder / "model" / name
                    else:
                        target = (batch_folder if prefix.startswith("reports/batches/") else folder) / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(s3.get_object(Bucket=self.bucket, Key=item["Key"])["Body"].read())
                    copied.append(target)
        if getattr(self, "_slack_messages", None):
            (folder / "slack-message.json").write_text(json.dumps(self._slack_messages[-1], indent=2))
        self._stage("Where to look")
        report_path = folder / "report.html"
        rows = [
            ("profiling report", report_path, prefixes.run_report_key(run, "report.html")),
            ("run summary", folder / "summary.json", prefixes.run_report_key(run, "summary.json")),
            ("metrics", folder / "metrics.json", prefixes.run_report_key(run, "metrics.json")),
            ("rule verdicts", folder / "rules.json", prefixes.run_report_key(run, "rules.json")),
            ("model (PyTorch state dict)", folder / "model" / "model.pt", f"models/runs/{run}/model.pt"),
            ("Slack message (Block Kit JSON)", folder / "slack-message.json", None),
        ]
        places = []
        for what, path, key in rows:
            if not path.exists():
                continue
            places.append(Place(what, path, f"s3://{self.bucket}/{key}" if key else None))
            location = f"  ({places[-1].s3_uri})" if key else ""
            self.console.print(f"  {what:<31} {path}{location}", soft_wrap=True)
        relabel = batch_folder / "report.md"
        if relabel.exists():
            places.append(
                Place(
                    f"{screened} relabel list",
                    relabel,
                    f"s3://{self.bucket}/{prefixes.report_key(screened, 'report.md')}",
                )
            )
            self.console.print(f"  {places[-1].what:<31} {relabel}  ({places[-1].s3_uri})", soft_wrap=True)
        pictures = sorted((batch_folder / "fix").glob("*.png"))
        if pictures:
            places.append(Place("pictures of the pairs to fix", batch_folder / "fix"))
            shows = "image, label, the model's view, where they disagree"
            where = f"{batch_folder / 'fix'}/ ({len(pictures)} PNG: {shows})"
            self.console.print(f"  {places[-1].what:<31} {where}", soft_wrap=True)
        places.append(Place("Lambda logs and EMF metrics", self.function_log))
        self.console.print(f"  {places[-1].what:<31} {self.function_log}  (on AWS: CloudWatch Logs)", soft_wrap=True)
        if report_path.exists():
            self.console.print(f"\n  Open the report in a browser: [bold]{report_path.as_uri()}[/bold]", soft_wrap=True)
        if report is not None and not relabel.exists():
            batch = report["batch"]
            self.console.print(f"  Batch report: s3://{self.bucket}/{prefixes.report_key(batch, 'report.md')}")
        self.console.print(
            "  To keep the stack up and steer runs yourself: `retrain local up`, then `retrain runs list`.",
            soft_wrap=True,
        )
        return folder, report_path if report_path.exists() else None, places


class _LogTail:
    """New lines of a training job's CloudWatch log streams (SageMaker: one per host)."""

    def __init__(self, logs: Any) -> None:
        self._logs = logs
        self._seen: set[str] = set()

    def new_lines(self, job: str) -> list[str]:
        lines = []
        try:
            pages = self._logs.get_paginator("filter_log_events").paginate(
                logGroupName=LOG_GROUP, logStreamNamePrefix=f"{job}/algo-1"
            )
            for page in pages:
                for event in page.get("events", []):
                    if event["eventId"] not in self._seen:
                        self._seen.add(event["eventId"])
                        # Only this job's stream: moto's FilterLogEvents ignores the name prefix.
                        if event["logStreamName"].startswith(f"{job}/algo-1"):
                            lines.append(event["message"])
        except self._logs.exceptions.ResourceNotFoundException:
            return []  # the stream appears with the job's first flush
        return lines


def _files(pairs: list[tuple[Path, Path]]) -> list[tuple[str, bytes]]:
    """The scenes as an annotation team uploads them, with five broken on purpose, then the marker."""
    files: list[tuple[str, bytes]] = []
    for image, label in pairs:
        files.append((f"images/{image.name}", image.read_bytes()))
        files.append((f"labels/{label.name}", label.read_bytes()))
    # 1. A mask painted with a class id the taxonomy does not have (road as 77).
    name, body = files[-1]
    files[-1] = (name, _repaint(body, lambda value: 77 if value == 0 else value))
    # 2. A photo cut off mid-upload.
    name, body = files[-4]
    files[-4] = (name, body[: len(body) // 2])
    # 3. A mask of another size than its photo.
    name, body = files[-5]
    files[-5] = (name, _resized(body))
    # 4. A photo uploaded twice, under another name (with a label of its own).
    files.append(("images/scene-copy.jpg", files[0][1]))
    files.append(("labels/scene-copy.png", files[1][1]))
    # 5. A file that is neither.
    files.append(("images/notes.txt", b"annotator's notes, uploaded by mistake"))
    files.append(("_COMPLETE", b""))
    return files


def _repaint(png: bytes, change: Any) -> bytes:
    with Image.open(io.BytesIO(png)) as mask:
        buffer = io.BytesIO()
        mask.point(change).save(buffer, format="PNG")
    return buffer.getvalue()


def _resized(png: bytes) -> bytes:
    with Image.open(io.BytesIO(png)) as mask:
        buffer = io.BytesIO()
        mask.resize((mask.width // 2, mask.height // 2), Image.Resampling.NEAREST).save(buffer, format="PNG")
    return buffer.getvalue()


def _slack_as_text(message: dict[str, Any]) -> str:
    """A Block Kit message as a person sees it in the channel, near enough to read in a terminal."""
    lines: list[str] = []
    for block in message.get("blocks", []):
        kind = block.get("type")
        if kind == "header":
            lines.append(f"  # {block['text']['text']}")
        elif kind == "section":
            if "text" in block:
                lines += [f"  {line}" for line in block["text"]["text"].splitlines()]
            for item in block.get("fields", []):
                lines.append(f"  {item['text'].replace(chr(10), ' ')}")
        elif kind == "context":
            lines.append("  " + " | ".join(element.get("text", "") for element in block.get("elements", [])))
        elif kind == "actions":
            labels = [element["text"]["text"] for element in block.get("elements", []) if "text" in element]
            lines.append("  [" + "] [".join(labels) + "]")
        elif kind == "divider":
            lines.append("  ---")
    return "\n".join(lines)
