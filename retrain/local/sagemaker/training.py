"""SageMaker training jobs for the offline stack: the real trainer, under torchrun, on this machine.

`TrainingEmulator` serves CreateTrainingJob, DescribeTrainingJob, StopTrainingJob, ListTrainingJobs
and a training job's ListTags through the `EmulatorRegistry` (so requests and answers are checked
against botocore's model). Each job runs in a thread of its own that plays what SageMaker does, in
its order and with its names:

- `container.py`: the container contract (`/opt/ml` per host, `SM_*`, the launcher);
- `storage.py`: S3 downloads and uploads, CloudWatch Logs;
- `processes.py`: the hosts' processes and this machine's cores;
- `runner.py`: one job's life, Starting to Completed (or Failed, Stopped);
- `debugger.py`: Debugger's system monitor and profiler rules, when asked for;
- `state.py`: the job as DescribeTrainingJob shows it, and as its state-change events tell it.

Deviations from AWS that cannot be helped here: the TrainingImage is not run (the trainer runs on
this machine's Python, `python`), instance types only decide how many processes a host runs (one
per GPU, capped to this machine's cores), every emulated host is a folder and a process group on
this one machine (loopback networking), and `/opt/ml` paths are replaced by the hosts' folders.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retrain.local.endpoint.emulators import EmulatedServiceError, EmulatorRegistry
from retrain.local.sagemaker.container import plan_processes
from retrain.local.sagemaker.debugger import RuleEvaluations
from retrain.local.sagemaker.processes import CorePool
from retrain.local.sagemaker.runner import JobRunner, RunnerSettings
from retrain.local.sagemaker.state import TERMINAL_STATUSES, JobState, training_job_arn
from retrain.local.sagemaker.storage import join_uri
from trainer.profiling.monitor import ALLOWED_INTERVALS_MS

if TYPE_CHECKING:
    from mypy_boto3_logs import CloudWatchLogsClient
    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)

OPERATIONS = ("CreateTrainingJob", "DescribeTrainingJob", "StopTrainingJob")
NOT_FOUND = "Requested resource not found."
WAIT_POLL_SECONDS = 0.1

# EventBridge's "SageMaker Training Job State Change", on every TrainingJobStatus change.
EVENT_SOURCE = "aws.sagemaker"
STATE_CHANGE = "SageMaker Training Job State Change"

FileSystemResolver = Callable[[str, str], Path]
# Where the jobs' events go: (source, detail-type, detail, resources), as a service puts them.
EventSink = Callable[[str, str, dict[str, Any], list[str]], object]


class TrainingEmulator:
    """The training jobs of one offline stack, their state in memory (thread-safe)."""

    def __init__(
        self,
        *,
        s3: S3Client,
        logs: CloudWatchLogsClient | None = None,
        workdir: Path,
        region: str,
        account_id: str,
        resolve_file_system: FileSystemResolver,
        max_processes: int | None = None,
        rule_delay_seconds: float = 0.0,
        python: str = sys.executable,
        stop_grace_seconds: float = 120.0,
        on_event: EventSink | None = None,
    ) -> None:
        """`max_processes` plays this machine's cores (default `os.cpu_count()`): no more trainer
        processes than that run at once, over all jobs. `rule_delay_seconds`: how long Debugger's
        rule jobs outlive their training job. `stop_grace_seconds`: SIGTERM to SIGKILL (120 s
        on SageMaker). `on_event`: EventBridge's default bus, which gets a state-change event
        for every status of every job (InProgress, Stopping, Completed, Failed, Stopped)."""
        self.region = region
        self._on_event = on_event
        self.account_id = account_id
        self.rule_delay_seconds = rule_delay_seconds
        self._resolve_file_system = resolve_file_system
        self._settings = RunnerSettings(
            s3=s3,
            logs=logs,
            workdir=workdir,
            python=python,
            # Taken now: a Lambda invoked in-process swaps os.environ while it runs, and its
            # variables must not reach a training job that it happens to create.
            base_environment=dict(os.environ),
            pool=CorePool(max_processes or os.cpu_count() or 1),
            stop_grace_seconds=stop_grace_seconds,
        )
        self._jobs: dict[str, JobRunner] = {}
        self._lock = threading.Lock()
        self._throttles: dict[str, int] = {}
        self._describe_failure: EmulatedServiceError | None = None
        self._describe_failures_left: int | None = None

    @property
    def max_processes(self) -> int:
        return self._settings.pool.size

    def register(self, registry: EmulatorRegistry) -> None:
        registry.register("sagemaker", "CreateTrainingJob", self.create_training_job)
        registry.register("sagemaker", "DescribeTrainingJob", self.describe_training_job)
        registry.register("sagemaker", "StopTrainingJob", self.stop_training_job)
        registry.register("sagemaker", "ListTrainingJobs", self.list_training_jobs)
        registry.register("sagemaker", "ListTags", self.list_tags)

    # ------------------------------------------------------------ fault injection --
    def throttle(self, operation: str, times: int) -> None:
        """Answer the next `times` calls of `operation` with ThrottlingException (HTTP 400), before
        anything of the call runs."""
        if operation not in OPERATIONS:
            raise ValueError(f"{operation!r} is not one of {', '.join(OPERATIONS)}")
        with self._lock:
            self._throttles[operation] = self._throttles.get(operation, 0) + times

    def fail_describe(self, code: str, message: str, status: int = 400, times: int | None = None) -> None:
        """The next `times` DescribeTrainingJob calls (every later one: None) fail with this error."""
        with self._lock:
            self._describe_failure = EmulatedServiceError(code, message, status)
            self._describe_failures_left = times

    def occupy_cores(self) -> Callable[[], None]:
        """Take every core, as other work on this machine would: a job created now waits for
        them, InProgress ("Starting", waiting for cores) and running nothing, until it is stopped
        or the returned function gives the cores back."""
        pool = self._settings.pool
        pool.acquire(pool.size, cancelled=threading.Event(), on_wait=lambda: None)  # waits for running jobs
        return lambda: pool.release(pool.size)

    def _faults(self, operation: str) -> None:
        with self._lock:
            if self._throttles.get(operation, 0) > 0:
                self._throttles[operation] -= 1
                raise EmulatedServiceError("ThrottlingException", "Rate exceeded", 400)
            if operation == "DescribeTrainingJob" and self._describe_failure is not None:
                failure = self._describe_failure
                if self._describe_failures_left is not None:
                    self._describe_failures_left -= 1
                    if self._describe_failures_left <= 0:
                        self._describe_failure = None
                raise failure

    # ------------------------------------------------------------------- the API --
    def create_training_job(self, params: dict[str, Any]) -> dict[str, Any]:
        self._faults("CreateTrainingJob")
        name: str = params["TrainingJobName"]
        arn = training_job_arn(self.region, self.account_id, name)
        if self._find(name) is not None:
            raise _name_in_use(arn)
        _check_request(params)
        # Resolved now: an unknown file system is refused by the call, as on AWS.
        mounts = {
            channel["ChannelName"]: self._resolve_file_system(source["FileSystemId"], source["DirectoryPath"])
            for channel in params.get("InputDataConfig", [])
            if (source := channel["DataSource"].get("FileSystemDataSource")) is not None
        }
        output = params["OutputDataConfig"]["S3OutputPath"]
        evaluations: RuleEvaluations | None = None
        job = JobState(
            params,
            arn=arn,
            model_artifacts=join_uri(output, name, "output", "model.tar.gz"),
            on_change=self._announce if self._on_event is not None else None,
        )
        if params.get("ProfilerRuleConfigurations"):
            evaluations = RuleEvaluations(
                params["ProfilerRuleConfigurations"],
                job_name=name,
                region=self.region,
                account_id=self.account_id,
                created=job.created,
                delay_seconds=self.rule_delay_seconds,
            )
            job.rules = evaluations
        resources = params["ResourceConfig"]
        plan = plan_processes(resources["InstanceType"], int(resources.get("InstanceCount", 1)), self.max_processes)
        definitions = params["AlgorithmSpecification"].get("MetricDefinitions", [])
        runner = JobRunner(
            job,
            self._settings,
            plan=plan,
            mounts=mounts,
            metric_definitions=[(item["Name"], re.compile(item["Regex"])) for item in definitions],
            evaluations=evaluations,
        )
        with self._lock:
            if name.lower() in self._jobs:
                raise _name_in_use(arn)
            self._jobs[name.lower()] = runner
        job.announce()  # InProgress, before the job can move on
        runner.start()
        log.info("training job %s created (%s)", name, plan)
        return {"TrainingJobArn": arn}

    def list_training_jobs(self, params: dict[str, Any]) -> dict[str, Any]:
        """Newest first (AWS's default order is by creation time, descending), filters applied."""
        with self._lock:
            runners = list(self._jobs.values())
        summaries = []
        for runner in runners:
            described = runner.job.describe()
            summary = {
                key: described[key]
                for key in (
                    "TrainingJobName",
                    "TrainingJobArn",
                    "CreationTime",
                    "TrainingEndTime",
                    "LastModifiedTime",
                    "TrainingJobStatus",
                )
                if described.get(key) is not None
            }
            if params.get("StatusEquals") and summary["TrainingJobStatus"] != params["StatusEquals"]:
                continue
            if params.get("NameContains") and params["NameContains"] not in summary["TrainingJobName"]:
                continue
            summaries.append(summary)
        summaries.sort(
            key=lambda item: item["CreationTime"], reverse=params.get("SortOrder", "Descending") == "Descending"
        )
        return {"TrainingJobSummaries": summaries[: params.get("MaxResults", 100)]}

    def list_tags(self, params: dict[str, Any]) -> dict[str, Any]:
        """The tags a job was created with (only training jobs live here); one page."""
        arn: str = params["ResourceArn"]
        runner = self._find(arn.rpartition(":training-job/")[2]) if ":training-job/" in arn else None
        if runner is None or runner.job.arn != arn:
            raise EmulatedServiceError("ValidationException", NOT_FOUND)
        return {"Tags": [dict(tag) for tag in runner.job.request.get("Tags", [])]}

    def describe_training_job(self, params: dict[str, Any]) -> dict[str, Any]:
        self._faults("DescribeTrainingJob")
        runner = self._find(params["TrainingJobName"])
        if runner is None:
            raise EmulatedServiceError("ValidationException", NOT_FOUND)
        return runner.job.describe()

    def stop_training_job(self, params: dict[str, Any]) -> dict[str, Any]:
        self._faults("StopTrainingJob")
        runner = self._find(params["TrainingJobName"])
        if runner is None:
            raise EmulatedServiceError("ValidationException", NOT_FOUND)
        if not runner.job.request_stop("Stopped"):
            raise EmulatedServiceError(
                "ValidationException",
                "The request was rejected because the training job is in status "
                f"{runner.job.describe()['TrainingJobStatus']}.",
            )
        return {}

    # -------------------------------------------------------------------- helpers --
    def wait(self, job_name: str, timeout: float) -> dict[str, Any]:
        """Until the job is Completed, Failed or Stopped: its DescribeTrainingJob answer."""
        runner = self._find(job_name)
        if runner is None:
            raise KeyError(f"no training job {job_name!r}")
        deadline = time.monotonic() + timeout
        while True:
            description = runner.job.describe()
            if description["TrainingJobStatus"] in TERMINAL_STATUSES:
                return description
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"training job {job_name} still {description['TrainingJobStatus']} "
                    f"({description['SecondaryStatus']}) after {timeout} s"
                )
            time.sleep(WAIT_POLL_SECONDS)

    def pids(self, job_name: str) -> list[int]:
        """Every process the job's hosts have run so far (launchers and the workers seen)."""
        runner = self._find(job_name)
        if runner is None:
            raise KeyError(f"no training job {job_name!r}")
        return [pid for host in list(runner.hosts) for pid in host.pids()]

    def stop_all(self, timeout: float = 30) -> None:
        """Stop every job (at most `timeout` / 2 of SIGTERM grace), join their threads, and kill
        whatever still runs: nothing started here outlives this call."""
        deadline = time.monotonic() + timeout
        with self._lock:
            runners = list(self._jobs.values())
        for runner in runners:
            runner.request_shutdown(grace=timeout / 2)
        for runner in runners:
            runner.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        for runner in runners:
            if runner.thread.is_alive():
                log.warning("training job %s did not end within %.0f s", runner.job.name, timeout)
            for host in list(runner.hosts):
                if host.alive():
                    host.kill()

    def _announce(self, job: JobState) -> None:
        assert self._on_event is not None
        self._on_event(EVENT_SOURCE, STATE_CHANGE, job.state_change_detail(), [job.arn])

    def _find(self, name: str) -> JobRunner | None:
        with self._lock:
            return self._jobs.get(name.lower())


def _name_in_use(arn: str) -> EmulatedServiceError:
    return EmulatedServiceError(
        "ResourceInUse",
        "Training job names must be unique within an AWS account and region, and a training job "
        f"with this name already exists ({arn})",
    )


def _check_request(params: dict[str, Any]) -> None:
    """What CreateTrainingJob refuses on AWS's side that botocore's model does not say."""
    interval = params.get("ProfilerConfig", {}).get("ProfilingIntervalInMilliseconds")
    if interval is not None and interval not in ALLOWED_INTERVALS_MS:
        allowed = ", ".join(str(value) for value in ALLOWED_INTERVALS_MS)
        raise EmulatedServiceError(
            "ValidationException",
            f"ProfilingIntervalInMilliseconds {interval} is not one of {allowed}",
        )
    for definition in params["AlgorithmSpecification"].get("MetricDefinitions", []):
        try:
            re.compile(definition["Regex"])
        except re.error as error:
            raise EmulatedServiceError(
                "ValidationException",
                f"MetricDefinitions {definition['Name']}: {definition['Regex']!r} is not a valid "
                f"regular expression ({error})",
            ) from None
    resources = params["ResourceConfig"]
    if "InstanceType" not in resources or resources.get("InstanceCount", 1) < 1:
        raise EmulatedServiceError(
            "ValidationException",
            "the offline stack runs jobs of one InstanceType and an InstanceCount of at least 1 (no InstanceGroups)",
        )
