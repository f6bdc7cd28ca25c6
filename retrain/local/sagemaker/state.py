"""One emulated training job's state, and DescribeTrainingJob's answer built from it.

Names and enumerations follow botocore's sagemaker model (`DescribeTrainingJobResponse`,
`SecondaryStatusTransition`); the StatusMessages are the ones SageMaker writes. Every method takes
the job's own lock: the API handlers read a job while its supervising thread moves it along.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

log = logging.getLogger(__name__)

# TrainingJobStatus values a job never leaves.
TERMINAL_STATUSES = frozenset({"Completed", "Failed", "Stopped"})
# FailureReason and StatusDetails: at most 1024 characters in botocore's model.
MAX_REASON = 1024

# What SageMaker says in each SecondaryStatus.
MESSAGES: dict[str, str] = {
    "Starting": "Preparing the instances for training",
    "Downloading": "Downloading input data",
    "Training": "Training image download completed. Training in progress.",
    "Uploading": "Uploading generated training model",
    "Completed": "Training job completed",
    "Failed": "Training job failed",
    "Stopping": "Stopping the training job",
    "Stopped": "Training job stopped",
    "MaxRuntimeExceeded": "Training job exceeded MaxRuntimeInSeconds provided",
}
WAITING_FOR_CORES = "waiting for a free core on this machine"

# CreateTrainingJob members DescribeTrainingJob echoes (same shapes in botocore's model).
ECHOED = (
    "HyperParameters",
    "AlgorithmSpecification",
    "RoleArn",
    "InputDataConfig",
    "OutputDataConfig",
    "ResourceConfig",
    "VpcConfig",
    "StoppingCondition",
    "EnableNetworkIsolation",
    "EnableInterContainerTrafficEncryption",
    "EnableManagedSpotTraining",
    "CheckpointConfig",
    "DebugHookConfig",
    "DebugRuleConfigurations",
    "TensorBoardOutputConfig",
    "ExperimentConfig",
    "ProfilerConfig",
    "ProfilerRuleConfigurations",
    "Environment",
    "RetryStrategy",
    "RemoteDebugConfig",
    "InfraCheckConfig",
)


def now() -> datetime:
    """The time as SageMaker reports it: UTC, to the millisecond."""
    moment = datetime.now(UTC)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def training_job_arn(region: str, account_id: str, name: str) -> str:
    # SageMaker lower-cases the name in the ARN (names are unique regardless of case).
    return f"arn:aws:sagemaker:{region}:{account_id}:training-job/{name.lower()}"


def clip(text: str, limit: int = MAX_REASON) -> str:
    """At most `limit` characters: the start (what kind of error) and the end (what went wrong)."""
    if len(text) <= limit:
        return text
    head = min(100, limit // 4)
    return f"{text[:head]} ... {text[-(limit - head - 5) :]}"


class RuleStatuses(Protocol):
    """What Debugger's rule evaluations report (`debugger.RuleEvaluations`)."""

    def statuses(self, *, at: datetime, job_status: str, ended: datetime | None) -> list[dict[str, Any]]: ...


@dataclass
class Transition:
    status: str
    start: datetime
    message: str
    end: datetime | None = None

    def to_api(self) -> dict[str, Any]:
        item: dict[str, Any] = {
            "Status": self.status,
            "StartTime": self.start,
            "StatusMessage": self.message,
        }
        if self.end is not None:
            item["EndTime"] = self.end
        return item


class JobState:
    """A training job as DescribeTrainingJob shows it, moved along by its supervisor.

    `on_change` is called with the job after each TrainingJobStatus change (Stopping, and the end),
    and by `announce()` (its creation, InProgress): one at a time, in the order of the changes."""

    def __init__(
        self,
        request: dict[str, Any],
        *,
        arn: str,
        model_artifacts: str,
        rules: RuleStatuses | None = None,
        on_change: Callable[[JobState], object] | None = None,
    ) -> None:
        self.request = copy.deepcopy(request)
        self.name: str = request["TrainingJobName"]
        self.arn = arn
        self.model_artifacts = model_artifacts
        self.rules = rules
        self.on_change = on_change
        self.lock = threading.Lock()
        # Held from a status change until it is announced, so announcements keep the changes' order.
        self._announcing = threading.Lock()
        # Set by StopTrainingJob and by the runtime limit; the supervisor acts on it.
        self.stop_requested = threading.Event()
        self.stop_cause: str | None = None
        self.created = now()
        self.last_modified = self.created
        self.status = "InProgress"
        self.transitions = [Transition("Starting", self.created, MESSAGES["Starting"])]
        self.training_start: datetime | None = None
        self.training_end: datetime | None = None
        self.failure_reason: str | None = None
        self.final_metrics: list[dict[str, Any]] = []

    # ------------------------------------------------------------ reading --
    @property
    def terminal(self) -> bool:
        with self.lock:
            return self.status in TERMINAL_STATUSES

    @property
    def secondary(self) -> str:
        with self.lock:
            return self.transitions[-1].status

    @property
    def started(self) -> datetime | None:
        with self.lock:
            return self.training_start

    @property
    def ended(self) -> datetime | None:
        with self.lock:
            return self.training_end

    def describe(self) -> dict[str, Any]:
        """DescribeTrainingJob's answer now (a copy: nothing in it is shared with the state)."""
        with self.lock:
            response: dict[str, Any] = {
                "TrainingJobName": self.name,
                "TrainingJobArn": self.arn,
                # Required by the model; SageMaker names the artifact's place from the start.
                "ModelArtifacts": {"S3ModelArtifacts": self.model_artifacts},
                "TrainingJobStatus": self.status,
                "SecondaryStatus": self.transitions[-1].status,
                "CreationTime": self.created,
                "LastModifiedTime": self.last_modified,
                "SecondaryStatusTransitions": [t.to_api() for t in self.transitions],
            }
            response.update(_echo(self.request))
            if self.failure_reason is not None:
                response["FailureReason"] = self.failure_reason
            if self.training_start is not None:
                response["TrainingStartTime"] = self.training_start
            if self.training_end is not None:
                response["TrainingEndTime"] = self.training_end
                if self.training_start is not None:
                    seconds = (self.training_end - self.training_start).total_seconds()
                    response["TrainingTimeInSeconds"] = max(1, round(seconds))
                    response["BillableTimeInSeconds"] = max(1, round(seconds))
            if self.final_metrics and self.status in TERMINAL_STATUSES:
                response["FinalMetricDataList"] = copy.deepcopy(self.final_metrics)
            profiler = self.request.get("ProfilerConfig")
            if profiler is not None:
                disabled = bool(profiler.get("DisableProfiler", False))
                response["ProfilingStatus"] = "Disabled" if disabled else "Enabled"
            status, ended = self.status, self.training_end
        if self.rules is not None:
            # Only when rules were asked for, as on AWS: otherwise the key is absent.
            response["ProfilerRuleEvaluationStatuses"] = self.rules.statuses(at=now(), job_status=status, ended=ended)
        return response

    def state_change_detail(self) -> dict[str, Any]:
        """The detail of the "SageMaker Training Job State Change" event: DescribeTrainingJob's
        answer with its times in epoch milliseconds, and the job's tags as a map."""
        detail = _epoch_millis(self.describe())
        detail["Tags"] = {tag["Key"]: tag["Value"] for tag in self.request.get("Tags", [])}
        assert isinstance(detail, dict)
        return detail

    # ------------------------------------------------------------ moving --
    def announce(self) -> None:
        """Tell `on_change` the job's status now (the emulator does once the job exists)."""
        with self._announcing:
            self._announce()

    def _announce(self) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(self)
        except Exception:  # whoever listens, the job goes on
            log.exception("training job %s: announcing its status failed", self.name)

    def advance(self, status: str, message: str | None = None) -> bool:
        """Enter SecondaryStatus `status`; False (and nothing changes) once a stop was asked."""
        with self.lock:
            if self.stop_cause is not None or self.status in TERMINAL_STATUSES:
                return False
            self._transition(status, message)
            if status == "Downloading" and self.training_start is None:
                self.training_start = self.transitions[-1].start
            return True

    def note(self, message: str) -> None:
        """Replace the current SecondaryStatus's message (SageMaker updates it in place)."""
        with self.lock:
            self.transitions[-1].message = message
            self.last_modified = now()

    def request_stop(self, cause: str) -> bool:
        """StopTrainingJob (`cause` "Stopped") or the runtime limit ("MaxRuntimeExceeded"): the
        job goes Stopping. False when it has already ended; True when already stopping."""
        with self._announcing:
            with self.lock:
                if self.status in TERMINAL_STATUSES:
                    return False
                changed = self.stop_cause is None
                if changed:
                    self.stop_cause = cause
                    self.status = "Stopping"
                    message = MESSAGES["Stopping"]
                    if cause == "MaxRuntimeExceeded":
                        limit = self.request.get("StoppingCondition", {}).get("MaxRuntimeInSeconds")
                        message = f"{message}: it ran past MaxRuntimeInSeconds ({limit} s)"
                    self._transition("Stopping", message)
                self.stop_requested.set()
            if changed:
                self._announce()
            return True

    def finish(self, status: str, *, failure_reason: str | None = None) -> None:
        """The end: Completed, Failed or Stopped (the cause picks Stopped's SecondaryStatus)."""
        with self._announcing:
            with self.lock:
                if self.status in TERMINAL_STATUSES:
                    return
                # A stop ends in Stopped or MaxRuntimeExceeded, whichever caused it.
                secondary = (self.stop_cause or "Stopped") if status == "Stopped" else status
                self._transition(secondary, MESSAGES[secondary])
                self.transitions[-1].end = self.transitions[-1].start
                self.status = status
                if failure_reason is not None:
                    self.failure_reason = clip(failure_reason)
                self.training_end = self.transitions[-1].start
                if self.training_start is None:
                    self.training_start = self.training_end
            self._announce()

    def _transition(self, status: str, message: str | None) -> None:
        moment = now()
        current = self.transitions[-1]
        if current.status == status:
            current.message = message or current.message
        else:
            current.end = moment
            self.transitions.append(Transition(status, moment, message or MESSAGES[status]))
        self.last_modified = moment


def _epoch_millis(value: Any) -> Any:
    """`value` with every datetime in it as milliseconds since the epoch, as SageMaker's events
    carry times."""
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, dict):
        return {key: _epoch_millis(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_epoch_millis(item) for item in value]
    return value


def _echo(request: dict[str, Any]) -> dict[str, Any]:
    """The request's members as DescribeTrainingJob returns them, with the defaults AWS fills."""
    echoed = {name: copy.deepcopy(request[name]) for name in ECHOED if name in request}
    for flag in (
        "EnableNetworkIsolation",
        "EnableInterContainerTrafficEncryption",
        "EnableManagedSpotTraining",
    ):
        echoed.setdefault(flag, False)
    for channel in echoed.get("InputDataConfig", []):
        channel.setdefault("CompressionType", "None")
        channel.setdefault("RecordWrapperType", "None")
    output = echoed.get("OutputDataConfig")
    if output is not None:
        output.setdefault("KmsKeyId", "")
        output.setdefault("CompressionType", "GZIP")
    for rule in echoed.get("ProfilerRuleConfigurations", []):
        rule.setdefault("VolumeSizeInGB", 0)
    return echoed
