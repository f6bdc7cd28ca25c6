"""Run summaries a team is told about, one per kind of ending, with the links a message carries.

The gate compares the candidate with the accepted model on trusted pairs; the run's whole
validation split (new pairs included) scores lower, as a harder drop joins it: a message that put
the split's mIoU beside the gate's change would be two numbers that do not agree.
"""

from __future__ import annotations

from datetime import UTC, datetime

from functions.common.contracts import ScreenedBatchSummary, ScreeningSummary
from functions.common.summary import GateVerdict, JobSummary, RuleVerdict, RunArtifacts, RunSummary
from functions.notify.links import ReportLink, RunLinks, run_links

BUCKET = "retrain-data-111122223333-eu-central-1"
REGION = "eu-central-1"
STARTED = datetime(2026, 12, 3, 9, 15, 1, tzinfo=UTC)
FINISHED = datetime(2026, 12, 3, 10, 2, 41, tzinfo=UTC)
RUN = "ds-20261203-091500-4f1c2a9b"
JOB = f"retrain-{RUN}-52c840ad"
EXECUTION = f"arn:aws:states:{REGION}:111122223333:execution:retrain-retrain:{RUN}"
CLASSES = ("road", "sidewalk", "building", "vegetation", "sky", "person", "car")
# What gate.py says it compared on, when the version had trusted pairs.
TRUSTED = "both scored on 120 trusted validation pairs of 3 batches"
SPLIT_MIOU = 0.6905  # the candidate on its whole validation split, new pairs included


def _artifacts(*, report: bool = True) -> RunArtifacts:
    """An evaluated run's (reports/runs/<run>/), or without a report one that failed before its
    evaluation (reports/failures/<run>/, where NotifyFunction writes its summary)."""
    folder = f"s3://{BUCKET}/reports/{'runs' if report else 'failures'}/{RUN}/"
    return RunArtifacts(
        folder=folder,
        summary=f"{folder}summary.json",
        metrics=f"{folder}metrics.json" if report else None,
        rules=f"{folder}rules.json" if report else None,
        report=f"{folder}report.html" if report else None,
        model=f"s3://{BUCKET}/training/{JOB}/output/model.tar.gz" if report else None,
    )


def _job() -> JobSummary:
    return JobSummary(
        name=JOB,
        arn=f"arn:aws:sagemaker:{REGION}:111122223333:training-job/{JOB}",
        status="Completed",
        instance_type="ml.p4d.24xlarge",
        instance_count=2,
        distribution="torch",
        profiling="builtin",
        training_seconds=2580,
        billable_seconds=2580,
    )


def _base(**changes: object) -> RunSummary:
    summary = RunSummary(
        run=RUN,
        outcome="accepted",
        dataset_version=RUN,
        execution_arn=EXECUTION,
        pair_count=12480,
        new_pairs=1310,
        new_batches=["munich-2026-12-01", "munich-2026-12-02"],
        started_at=STARTED,
        finished_at=FINISHED,
        duration_seconds=(FINISHED - STARTED).total_seconds(),
        job=_job(),
        miou=SPLIT_MIOU,
        per_class_iou=dict.fromkeys(CLASSES, 0.7),
        train_images=11232,
        val_images=1248,
        epochs=100,
        baseline_run="ds-20261120-080000-0badc0de",
        rules_backend="builtin",
        rules=[
            RuleVerdict(name=name, status="NoIssuesFound") for name in ("CPUBottleneck", "IOBottleneck", "StepOutlier")
        ],
        artifacts=_artifacts(),
    )
    return summary.model_copy(update=changes)


def accepted() -> RunSummary:
    return _base(
        gate=GateVerdict(
            accepted=True,
            reasons=[
                f"mIoU 0.718, up 0.016 on the accepted model's 0.702 ({TRUSTED}); no class fell by more than 0.050"
            ],
            miou=0.7184,
            baseline_miou=0.7021,
            miou_change=0.0163,
            worse_classes={"person": -0.012},
            miou_tolerance=0.01,
            class_tolerance=0.05,
            compared_on=TRUSTED,
        )
    )


def rejected() -> RunSummary:
    return _base(
        outcome="rejected",
        miou=0.6544,
        gate=GateVerdict(
            accepted=False,
            reasons=[
                "mIoU fell to 0.681 from the accepted model's 0.702, by 0.021: more than the 0.010 allowed "
                f"({TRUSTED})",
                f"person IoU fell by 0.083: more than the 0.050 allowed ({TRUSTED})",
            ],
            miou=0.6812,
            baseline_miou=0.7021,
            miou_change=-0.0209,
            worse_classes={"person": -0.083, "car": -0.021},
            miou_tolerance=0.01,
            class_tolerance=0.05,
            compared_on=TRUSTED,
        ),
    )


def with_rule_issues() -> RunSummary:
    return accepted().model_copy(
        update={
            "rules": [
                RuleVerdict(
                    name="DataStall",
                    status="IssuesFound",
                    trigger_count=4,
                    recommendation=(
                        "The model waited for data 46 % of each step (median, rank 1 on algo-1; limit 20 %): the data "
                        "loader (2 workers) cannot keep up. Raise the data-loader workers (--workers) or decode faster"
                    ),
                ),
                RuleVerdict(
                    name="LowGPUUtilization",
                    status="IssuesFound",
                    trigger_count=2,
                    recommendation="GPUs were under-used: give the data loader more workers, or a larger batch.",
                ),
                RuleVerdict(name="CPUBottleneck", status="NoIssuesFound"),
                RuleVerdict(name="GPUMemoryIncrease", status="Error", detail="no GPU metrics on this run"),
            ]
        }
    )


NO_GPU = "no GPU metrics on this run (a CPU host, or no NVML/nvidia-smi)"
GPU_RULES = ("LowGPUUtilization", "CPUBottleneck", "IOBottleneck", "BatchSize", "GPUMemoryIncrease", "LoadBalancing")


def on_a_cpu_host() -> RunSummary:
    """A run on CPU instances: the GPU rules had nothing to judge (NoIssuesFound, not applicable)."""
    judged = ("StepOutlier", "Dataloader", "MaxInitializationTime", "OverallSystemUsage", "LossNotDecreasing")
    return accepted().model_copy(
        update={
            "job": _job().model_copy(update={"instance_type": "ml.m5.xlarge", "instance_count": 1}),
            "rules": [
                *(
                    RuleVerdict(
                        name=name, status="NoIssuesFound", detail=NO_GPU, applicable=False, not_applicable_reason=NO_GPU
                    )
                    for name in GPU_RULES
                ),
                *(RuleVerdict(name=name, status="NoIssuesFound") for name in judged),
                RuleVerdict(
                    name="DataStall",
                    status="NoIssuesFound",
                    detail="only 3 training steps per rank: too few to judge (at least 5)",
                    applicable=False,
                    not_applicable_reason="only 3 training steps per rank: too few to judge (at least 5)",
                ),
            ],
        }
    )


def failed_in_training() -> RunSummary:
    return _base(
        outcome="failed",
        miou=None,
        per_class_iou={},
        gate=None,
        rules=[],
        rules_backend=None,
        artifacts=_artifacts(report=False),
        failed_state="Check the training job",
        error="TrainingJobFailedError",
        cause=(
            f"training job {JOB} failed: AlgorithmError: ExecuteUserScriptError:\n"
            "ExitCode 1\n"
            'ErrorMessage "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 3; 79.15 GiB total '
            'capacity; 75.02 GiB already allocated)"'
        ),
    )


def failed_before_training() -> RunSummary:
    return _base(
        outcome="failed",
        job=None,
        miou=None,
        per_class_iou={},
        gate=None,
        rules=[],
        rules_backend=None,
        duration_seconds=94.0,
        artifacts=_artifacts(report=False),
        failed_state="Check the FSx import",
        error="FsxImportFailedError",
        cause=(
            "the FSx import task-0a1b2c3d4e5f60718 on fs-0a1b2c3d4e5f60718 ended FAILED: Access denied to "
            f"s3://{BUCKET}/dataset/ (12480 of 12480 files failed); nothing was trained"
        ),
    )


def links_for(summary: RunSummary) -> RunLinks:
    report = None
    if summary.artifacts.report:
        report = ReportLink(
            url=f"https://{BUCKET}.s3.{REGION}.amazonaws.com/reports/runs/{RUN}/report.html?X-Amz-Signature=0f1e2d",
            expires_at=datetime(2026, 12, 3, 11, 1, 41, tzinfo=UTC),
            valid_seconds=3540,
        )
    return run_links(
        region=REGION,
        bucket=BUCKET,
        folder=summary.artifacts.folder.removeprefix(f"s3://{BUCKET}/"),
        job_name=summary.job.name if summary.job else None,
        execution_arn=summary.execution_arn,
        report_key=f"reports/runs/{RUN}/report.html" if summary.artifacts.report else None,
        batches=summary.new_batches,
        report=report,
    )


def with_a_held_batch() -> RunSummary:
    """Screening held team-b's drop (a wrong class map); the run went on, and was accepted."""
    scores = {
        "team-a": {
            "trust": "trusted",
            "val_pairs": 24,
            "candidate": {"miou": 0.731, "per_class_iou": {"road": 0.95, "sky": 0.91, "car": 0.52}},
            "accepted": {"miou": 0.718, "per_class_iou": {"road": 0.94, "sky": 0.91, "car": 0.47}},
        },
        "team-b": {"trust": "new", "held": True, "val_pairs": 0},
        "team-c-night": {
            "trust": "new",
            "val_pairs": 9,
            "candidate": {"miou": 0.412, "per_class_iou": {"road": 0.71, "sky": 0.30}},
            "accepted": {"miou": 0.305, "per_class_iou": {"road": 0.52, "sky": 0.21}},
        },
    }
    return RunSummary.model_validate(
        {
            **accepted().model_dump(),
            "held": {
                "team-b": [
                    "62.4 % of its labelled pixels contradict the accepted model (4.1 % on trusted pairs); 58.3 % "
                    "beyond the model's usual confusions (held from 15 %)",
                    "labelled sky where the model sees road: 87 % of those pixels (0 % on trusted pairs)",
                    "labelled road where the model sees sky: 81 % of those pixels (1 % on trusted pairs)",
                ]
            },
            "batch_scores": scores,
            "newly_trusted": ["team-c-night"],
            "trusted_pairs": {"team-c-night": 31},
            "screening": {"screened": True, "held": ["team-b"]},
        }
    )


def _screened(team: str, pairs: int, judged: int, contradicted: int, verdict: str) -> ScreenedBatchSummary:
    return ScreenedBatchSummary(
        team=team, pair_count=pairs, judged=judged, contradicted=contradicted, verdict=verdict, held=verdict == "held"
    )


def with_pairs_left_out() -> RunSummary:
    """An independent model screened three drops: Munich's has 12 pairs it contradicts (left out for
    the team to fix, the rest trained on), Berlin's fog scenes it cannot judge, Hamburg's passed."""
    return accepted().model_copy(
        update={
            "new_batches": ["munich-2026-12-01", "berlin-fog-03", "hamburg-2026-12-02"],
            "screening": ScreeningSummary(
                screened=True,
                calibration="independent",
                left_out=12,
                batches={
                    "munich-2026-12-01": _screened("munich", 240, 236, 12, "pairs left out"),
                    "berlin-fog-03": _screened("berlin", 80, 9, 0, "not judged"),
                    "hamburg-2026-12-02": _screened("hamburg", 150, 148, 1, "pairs left out"),
                },
            ),
            "left_out": {"munich-2026-12-01": 12, "hamburg-2026-12-02": 1},
            "not_judged": ["berlin-fog-03"],
            "newly_trusted": ["hamburg-2026-12-02", "munich-2026-12-01"],
            "trusted_pairs": {"munich-2026-12-01": 224, "hamburg-2026-12-02": 147},
        }
    )


DISPUTE = (  # as trainer/screening/verdicts.py words it
    "disputed: it contradicts the provisional model trained on munich-2026-12-01 wholesale, and no independent "
    "labels say which is right: trained on, not trusted. Decide: name a benchmark of labels checked by hand "
    "(`retrain data benchmark`), or hold the wrong side (`retrain data hold`)"
)


def with_a_dispute() -> RunSummary:
    """The second drop ever: the provisional model (Munich's labels only) contradicts Hamburg's drop
    wholesale. Nobody checked either side: the run trained on both, and the gate accepts neither."""
    return _base(
        outcome="rejected",
        new_batches=["hamburg-2026-12-02"],
        gate=GateVerdict(
            accepted=False,
            reasons=[
                "trained on both sides of a dispute (hamburg-2026-12-02 against the model's own data): a model of "
                "two contradicting label sets is neither's; decide which is right first"
            ],
            miou=SPLIT_MIOU,
            miou_tolerance=0.01,
            class_tolerance=0.05,
        ),
        screening=ScreeningSummary(
            screened=True,
            calibration="provisional",
            disputed=["hamburg-2026-12-02"],
            batches={"hamburg-2026-12-02": _screened("hamburg", 150, 148, 105, "disputed")},
        ),
        disputed={
            "hamburg-2026-12-02": [
                DISPUTE,
                "labelled sidewalk where the model sees road: 64 % of the road pixels the model sees",
                "105 of its 148 judged pairs contradict the accepted model beyond its usual confusions (71 %; held "
                "from 15 %)",
            ]
        },
    )


CASES = {
    "with_a_held_batch": with_a_held_batch,
    "with_pairs_left_out": with_pairs_left_out,
    "with_a_dispute": with_a_dispute,
    "accepted": accepted,
    "rejected": rejected,
    "rules_with_issues": with_rule_issues,
    "rules_on_a_cpu_host": on_a_cpu_host,
    "failed_in_training": failed_in_training,
    "failed_before_training": failed_before_training,
}
