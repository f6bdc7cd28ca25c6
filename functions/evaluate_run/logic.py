"""EvaluateRun: publish what the job produced, judge the model, and record an accepted one.

From the job's output (`model.tar.gz`, `output.tar.gz`, and with the Debugger back end its rule
statuses and ProfilerReport files) this writes, under `reports/runs/<run>/`, `metrics.json`,
`rules.json`, the profiling report and `summary.json`: the evidence behind the verdict, which
only this function may write (the bucket policy). An accepted model's weights go to
`models/runs/<run>/model.pt` (the next run's starting point), the archive judged is sealed at
`models/packages/<run>/model.tar.gz` (written once, never replaced: `artifacts.seal`), it is
registered in the model package group as PendingManualApproval from that copy, with its SHA-256
and the metrics file's digest, and then `models/accepted.json` names it: that write is
the moment the model is accepted. It is conditional (S3's If-Match on the ETag read just before,
or If-None-Match for the first model), and made only while `accepted.json` still names the model
this run was compared with, so two evaluations can never both believe they set it: the one that
loses says which run was accepted instead, and its model stays registered but not accepted. The
batches' trust, `summary.json` and the history page come after it, with the outcome that held; a
retry that finds `accepted.json` naming this run already goes on from there.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError
from pydantic import BaseModel, ValidationError

from functions.common import prefixes
from functions.common.contracts import MetricsFile
from functions.common.debugger import (
    describe_job,
    normalise_debugger_results,
    read_profiler_reports,
)
from functions.common.errors import ConcurrentUpdateError, RunArtifactsMissingError
from functions.common.models import AcceptedModel, JobState, RunContext
from functions.common.rules import RulesFile, parse_rules_file
from functions.common.summary import GateVerdict, JobSummary, RuleVerdict, RunArtifacts, RunSummary
from functions.data.storage import DataBucket
from functions.evaluate_run import history
from functions.evaluate_run.artifacts import Sealed, read_members, seal, write_once
from functions.evaluate_run.gate import GatePolicy, judge
from functions.evaluate_run.trust import SCREENING_MEMBER, ScreeningFile, TrustChanges, TrustKeeper

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker import SageMakerClient

OUTPUT_MEMBERS = {"metrics.json", "rules.json", "report.html", SCREENING_MEMBER}
PICTURES_PREFIX = "screening/"  # the screened pairs' pictures (trainer/screening/pictures.py)
MODEL_MEMBERS = {"model.pt", "metrics.json"}
RUN_TAG = "retrain:run"
MODEL_SHA256_TAG = "retrain:model-sha256"
# S3's answers to a conditional write whose condition no longer holds: another write came first
# (412), is in flight (409), or removed the object an If-Match named (404).
LOST_WRITE = {"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey"}
COMMIT_TRIES = 3


class Evaluation(BaseModel):
    """EvaluateRun's output: what the notification needs at a glance."""

    outcome: str  # accepted | rejected
    summary_uri: str
    miou: float | None
    baseline_miou: float | None
    model_package_arn: str | None = None


@dataclass(frozen=True)
class Evaluator:
    s3: S3Client
    sagemaker: SageMakerClient
    bucket: str
    policy: GatePolicy
    model_package_group: str = ""
    # The batches' trust (held by screening, trusted by an accepted run); None: not kept.
    trust: TrustKeeper | None = None

    def evaluate(self, run: RunContext, job: JobState, now: datetime | None = None) -> Evaluation:
        now = now or datetime.now(UTC)
        described: Any = self.sagemaker.describe_training_job(TrainingJobName=job.job_name)
        base = f"{described['OutputDataConfig']['S3OutputPath'].rstrip('/')}/{job.job_name}/output"
        model_uri = described.get("ModelArtifacts", {}).get("S3ModelArtifacts") or f"{base}/model.tar.gz"
        outputs, _ = read_members(
            self.s3, f"{base}/output.tar.gz", OUTPUT_MEMBERS, required=False, prefixes=(PICTURES_PREFIX,)
        )
        model_files, model_version = read_members(self.s3, model_uri, MODEL_MEMBERS)
        metrics = _metrics(outputs.get("metrics.json") or model_files.get("metrics.json"), model_uri)
        if "model.pt" not in model_files:
            raise RunArtifactsMissingError(f"{model_uri} holds no model.pt")
        rules = self._rules(described, outputs, now)
        verdict = judge(metrics, self.policy, run.accepted)

        data = DataBucket(self.s3, self.bucket)
        folder = prefixes.run_report_key(run.run, "")
        # Written once: the package pins it by digest, and a retry must not put another job's
        # numbers under a verdict already given (EvidenceConflictError).
        metrics_file = metrics.model_dump_json(indent=2).encode()
        metrics_written = write_once(
            self.s3,
            self.bucket,
            prefixes.run_report_key(run.run, "metrics.json"),
            metrics_file,
            sha256=hashlib.sha256(metrics_file).hexdigest(),
            content_type="application/json",
        )
        artifacts = RunArtifacts(
            folder=self._uri(folder),
            summary=self._uri(prefixes.run_report_key(run.run, "summary.json")),
            metrics=metrics_written.uri,
            model=model_uri,
            model_version_id=model_version,
            output=f"{base}/output.tar.gz" if outputs else None,
        )
        if rules is not None:
            artifacts.rules = self._put(
                data, run.run, "rules.json", rules.model_dump_json(indent=2), "application/json"
            )
        screening = (
            ScreeningFile.model_validate_json(outputs[SCREENING_MEMBER]) if SCREENING_MEMBER in outputs else None
        )
        if screening is not None:
            artifacts.screening = self._put_bytes(
                run.run, SCREENING_MEMBER, outputs[SCREENING_MEMBER], "application/json"
            )
        # Before the commit point below: a retry redoes these, and they are idempotent.
        report = outputs.get("report.html") or self._debugger_report(described)
        if report is not None:
            artifacts.report = self._put_bytes(run.run, "report.html", report, "text/html; charset=utf-8")

        package_arn = None
        if verdict.accepted:
            weights = prefixes.run_weights_prefix(run.run)
            self.s3.put_object(Bucket=self.bucket, Key=f"{weights}model.pt", Body=model_files["model.pt"])
            artifacts.weights = self._uri(f"{weights}model.pt")
            # The very archive judged (by VersionId), copied where no job can write: what the
            # package names can no longer change under its approval.
            sealed = seal(self.s3, model_uri, model_version, self.bucket, prefixes.package_model_key(run.run))
            artifacts.sealed_model, artifacts.model_sha256 = sealed.uri, sealed.sha256
            package_arn = self._register(
                run=run,
                job=job,
                described=described,
                sealed=sealed,
                metrics=metrics,
                metrics_written=metrics_written,
            )
            assert metrics.miou is not None
            accepted = AcceptedModel(
                run=run.run,
                job_name=job.job_name,
                dataset_version=run.dataset_version,
                model_uri=sealed.uri,
                model_version_id=sealed.version_id,
                model_sha256=sealed.sha256,
                weights_prefix_uri=self._uri(weights),
                miou=metrics.miou,
                per_class_iou=metrics.per_class_iou,
                accepted_at=now,
                model_package_arn=package_arn,
            )
            # The commit point: from now on the next run starts from this model, unless another
            # run's was accepted since this one started.
            instead = self._commit(accepted, run.accepted)
            if instead is not None:
                verdict = _accepted_meanwhile(verdict, instead, run.accepted, package_arn)
        # After the commit point, with the outcome that held; a retry redoes these, and they are idempotent.
        changes = (
            self.trust.record(run.run, screening, pictures=outputs, now=now)
            if self.trust is not None
            else TrustChanges()
        )
        summary = RunSummary(
            run=run.run,
            outcome="accepted" if verdict.accepted else "rejected",
            dataset_version=run.dataset_version,
            execution_arn=run.execution_arn,
            pair_count=run.pair_count,
            new_pairs=run.new_pairs,
            new_batches=run.new_batches,
            started_at=run.started_at,
            finished_at=now,
            duration_seconds=(now - run.started_at).total_seconds() if run.started_at else None,
            job=job_summary(described),
            miou=metrics.miou,
            per_class_iou=metrics.per_class_iou,
            train_images=metrics.train_images,
            val_images=metrics.val_images,
            epochs=len(metrics.epochs),
            baseline_run=run.accepted.run if run.accepted else None,
            code_archive_sha256=run.code.sha256 if run.code else None,
            gate=verdict,
            rules_backend=rules.backend if rules else None,
            rules=[
                RuleVerdict(
                    name=rule.name,
                    status=rule.status,
                    trigger_count=rule.trigger_count,
                    recommendation=rule.recommendation,
                    detail=rule.detail,
                    applicable=rule.applicable,
                    not_applicable_reason=rule.not_applicable_reason,
                )
                for rule in (rules.rules if rules else [])
            ],
            artifacts=artifacts,
            model_package_arn=package_arn,
            screening=metrics.screening,
            batch_scores=metrics.evaluation.batches if metrics.evaluation else {},
            held=changes.held,
            left_out=changes.left_out,
            disputed=changes.disputed,
            not_judged=changes.not_judged,
            newly_trusted=sorted(changes.trusted),
            trusted_pairs=changes.trusted,
        )
        self._put(data, run.run, "summary.json", summary.model_dump_json(indent=2), "application/json")
        # Every run on one page (reports/index.html), this one included; links in every message.
        history.rewrite(self.s3, self.bucket, newest=summary)
        return Evaluation(
            outcome=summary.outcome,
            summary_uri=artifacts.summary,
            miou=metrics.miou,
            baseline_miou=verdict.baseline_miou,
            model_package_arn=package_arn,
        )

    # --------------------------------------------------------- the commit --
    def _commit(self, accepted: AcceptedModel, baseline: AcceptedModel | None) -> str | None:
        """Make `models/accepted.json` name `accepted`, if it still names `baseline` (the model
        this run was compared with; None: none). None when it does now; otherwise the run it
        names instead ("" when it names none), and nothing was written."""
        expected = baseline.run if baseline is not None else None
        for _ in range(COMMIT_TRIES):
            named, etag = self._accepted_now()
            if named == accepted.run:
                return None  # a retry after this run's own write
            if named != expected:
                return named or ""
            request: dict[str, Any] = {
                "Bucket": self.bucket,
                "Key": prefixes.ACCEPTED_MODEL,
                "Body": accepted.model_dump_json(indent=2).encode(),
                "ContentType": "application/json",
            }
            # Only over the version read above, or, where there was none, only if there still is none.
            request.update({"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"})
            try:
                self.s3.put_object(**request)
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") in LOST_WRITE:
                    continue  # it changed between our read and our write: read it again
                raise
            return None
        raise ConcurrentUpdateError(f"{prefixes.ACCEPTED_MODEL} kept changing while run {accepted.run} was accepted")

    def _accepted_now(self) -> tuple[str | None, str | None]:
        """The run `models/accepted.json` names now, and its ETag; (None, None) when there is none."""
        try:
            response = self.s3.get_object(Bucket=self.bucket, Key=prefixes.ACCEPTED_MODEL)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
                return None, None
            raise
        named = json.loads(response["Body"].read()).get("run")
        return (str(named) if named is not None else ""), response["ETag"]

    # ------------------------------------------------------------ the rules --
    def _rules(self, described: Any, outputs: dict[str, bytes], now: datetime) -> RulesFile | None:
        if described.get("ProfilerRuleConfigurations"):
            return normalise_debugger_results(described, read_profiler_reports(self.s3, described), generated_at=now)
        if "rules.json" in outputs:
            return parse_rules_file(outputs["rules.json"])
        return None  # profiling was off

    def _debugger_report(self, described: Any) -> bytes | None:
        if not described.get("ProfilerRuleConfigurations"):
            return None
        bucket, key = prefixes.split_s3_uri(describe_job(described).profiler_report_uri)
        try:
            body: bytes = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None
        return body

    # ------------------------------------------------------ model registry --
    def _register(
        self,
        *,
        run: RunContext,
        job: JobState,
        described: Any,
        sealed: Sealed,
        metrics: MetricsFile,
        metrics_written: Sealed,
    ) -> str | None:
        if not self.model_package_group:
            return None
        existing = self._package_of(run.run)
        if existing is not None:
            return existing  # a retry after the package was registered
        image = described["AlgorithmSpecification"]["TrainingImage"].replace(
            "/pytorch-training:", "/pytorch-inference:"
        )
        request: dict[str, Any] = {
            "ModelPackageGroupName": self.model_package_group,
            "ModelPackageDescription": (
                f"run {run.run} on dataset version {run.dataset_version}: mIoU {metrics.miou:.4f}"
            )[:1024],
            "ModelApprovalStatus": "PendingManualApproval",
            "InferenceSpecification": {
                "Containers": [{"Image": image, "ModelDataUrl": sealed.uri}],
                "SupportedContentTypes": ["application/x-image"],
                "SupportedResponseMIMETypes": ["application/json"],
            },
            # What a reviewer approves, pinned: the sealed archive's digest (S3 keeps the same
            # digest with the object) and version.
            "CustomerMetadataProperties": {
                RUN_TAG: run.run,
                "retrain:dataset-version": run.dataset_version,
                "retrain:training-job": job.job_name,
                "retrain:miou": f"{metrics.miou:.4f}",
                MODEL_SHA256_TAG: sealed.sha256,
                **({"retrain:model-version-id": sealed.version_id} if sealed.version_id else {}),
            },
        }
        statistics = {
            "ContentType": "application/json",
            "S3Uri": metrics_written.uri,
            "ContentDigest": f"sha256:{metrics_written.sha256}",
        }
        request["ModelMetrics"] = {"ModelQuality": {"Statistics": statistics}}
        arn: str = self.sagemaker.create_model_package(**request)["ModelPackageArn"]
        return arn

    def _package_of(self, run: str) -> str | None:
        """A package an earlier attempt registered for this run (the ten newest are looked at)."""
        listed = self.sagemaker.list_model_packages(
            ModelPackageGroupName=self.model_package_group,
            SortBy="CreationTime",
            SortOrder="Descending",
            MaxResults=10,
        )
        for package in listed.get("ModelPackageSummaryList", []):
            arn = package["ModelPackageArn"]
            described = self.sagemaker.describe_model_package(ModelPackageName=arn)
            if described.get("CustomerMetadataProperties", {}).get(RUN_TAG) == run:
                return arn
        return None

    # -------------------------------------------------------------- writing --
    def _uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def _put(self, data: DataBucket, run: str, name: str, text: str, content_type: str) -> str:
        data.put_text(prefixes.run_report_key(run, name), text, content_type)
        return self._uri(prefixes.run_report_key(run, name))

    def _put_bytes(self, run: str, name: str, body: bytes, content_type: str) -> str:
        key = prefixes.run_report_key(run, name)
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType=content_type)
        return self._uri(key)


def _accepted_meanwhile(
    verdict: GateVerdict, instead: str, baseline: AcceptedModel | None, package_arn: str | None
) -> GateVerdict:
    """The gate let the model through, but another run's model was accepted since this run
    started: this one is not accepted, and says why first."""
    if instead:
        what = f"run {instead} was accepted meanwhile: {prefixes.ACCEPTED_MODEL} names it"
    else:
        what = f"{prefixes.ACCEPTED_MODEL} was removed meanwhile"
    compared = f"run {baseline.run}'s model" if baseline is not None else "no model (the first run)"
    kept = f"it stays registered ({package_arn}) but is not accepted" if package_arn else "it is not accepted"
    reason = f"{what}, while this model was compared with {compared}: {kept}"
    return verdict.model_copy(
        update={"accepted": False, "reasons": [reason, *verdict.reasons], "accepted_meanwhile": instead}
    )


def job_summary(described: Any) -> JobSummary:
    resources = described.get("ResourceConfig", {})
    hyperparameters = described.get("HyperParameters", {})
    environment = described.get("Environment", {})
    return JobSummary(
        name=described["TrainingJobName"],
        arn=described.get("TrainingJobArn"),
        status=described.get("TrainingJobStatus"),
        instance_type=resources.get("InstanceType"),
        instance_count=resources.get("InstanceCount"),
        distribution=_decoded(hyperparameters.get("backend")),
        profiling=environment.get("RETRAIN_PROFILING"),
        training_seconds=described.get("TrainingTimeInSeconds"),
        billable_seconds=described.get("BillableTimeInSeconds"),
        spot=bool(described.get("EnableManagedSpotTraining")),
    )


def _decoded(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        decoded = json.loads(value)
    except ValueError:
        return value
    return str(decoded)


def _metrics(raw: bytes | None, model_uri: str) -> MetricsFile:
    if raw is None:
        raise RunArtifactsMissingError(f"neither output.tar.gz nor {model_uri} holds metrics.json")
    try:
        return MetricsFile.model_validate_json(raw)
    except ValidationError as error:
        raise RunArtifactsMissingError(f"metrics.json is not what the trainer writes: {error}") from error
