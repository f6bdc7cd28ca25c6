"""The background life of one emulated training job, SageMaker's steps in SageMaker's order.

Starting (waiting for cores if this machine is busy) -> Downloading (host folders, configuration,
code, channels, checkpoints) -> Training (every host's launcher, supervised) -> Uploading
(model.tar.gz, output.tar.gz, checkpoints) -> Completed; or Failed, Stopping/Stopped and
MaxRuntimeExceeded. A thread per job runs it; nothing it starts outlives it.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from functions.common.errors import RetrainError
from retrain.local.sagemaker import container, debugger, storage
from retrain.local.sagemaker.processes import CorePool, HostProcess
from retrain.local.sagemaker.state import MESSAGES, WAITING_FOR_CORES, JobState, now

if TYPE_CHECKING:
    from mypy_boto3_logs import CloudWatchLogsClient
    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)

POLL_SECONDS = 0.2
LOG_FLUSH_SECONDS = 1.0
# After SIGKILL: how long the processes may take to be gone before the job moves on regardless.
KILL_WAIT_SECONDS = 10.0


@dataclass(frozen=True)
class RunnerSettings:
    """What every job of one emulator shares."""

    s3: S3Client
    logs: CloudWatchLogsClient | None
    workdir: Path
    python: str
    base_environment: dict[str, str]
    pool: CorePool
    stop_grace_seconds: float


@dataclass(frozen=True)
class Outcome:
    status: str  # Completed | Failed | Stopped
    reason: str | None = None


class _Stopped(RetrainError):  # noqa: N818 (control flow: a stop was asked)
    pass


class JobRunner:
    """Runs one job in a thread of its own (`start()`); `grace` may be shortened by a shutdown."""

    def __init__(
        self,
        job: JobState,
        settings: RunnerSettings,
        *,
        plan: container.ProcessPlan,
        mounts: dict[str, Path],
        metric_definitions: list[tuple[str, re.Pattern[str]]],
        evaluations: debugger.RuleEvaluations | None,
    ) -> None:
        self.job = job
        self.settings = settings
        self.plan = plan
        self.mounts = mounts
        self.metrics = metric_definitions
        self.evaluations = evaluations
        self.grace = settings.stop_grace_seconds
        self.root = settings.workdir / job.name
        names = container.host_names(plan.hosts)
        self.layouts = [container.HostLayout(self.root / name, name) for name in names]
        self.hosts: list[HostProcess] = []
        self.streams = [storage.LogStream(settings.logs, job.name, name) for name in names]
        self.monitors: debugger.SystemMonitors | None = None
        self._cores = 0
        self._hosts_ended = False
        self._last_values: dict[str, dict[str, Any]] = {}
        self._values_lock = threading.Lock()
        self.thread = threading.Thread(target=self.run, name=f"training-{job.name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    # ------------------------------------------------------------------ life --
    def run(self) -> None:
        try:
            try:
                outcome = self._run()
            except _Stopped:
                outcome = Outcome("Stopped")
            except storage.JobFailure as failure:
                outcome = Outcome("Failed", str(failure))
            except Exception as error:  # a bug here must still end the job, as AWS would
                log.exception("the emulated training job %s broke", self.job.name)
                outcome = Outcome("Failed", f"InternalServerError: {type(error).__name__}: {error}")
            outcome = self._wind_down(outcome)
            self.job.finish(outcome.status, failure_reason=outcome.reason)
            log.info("training job %s: %s", self.job.name, outcome.status)
            self._evaluate_rules(outcome)
        finally:
            for host in self.hosts:
                if host.alive():
                    host.kill()
            self._release_cores()
            if self.monitors is not None:
                self.monitors.stop()

    def _run(self) -> Outcome:
        job, request = self.job, self.job.request
        hyperparameters = container.decode_hyperparameters(request.get("HyperParameters", {}))
        if hyperparameters.get("sagemaker_distributed_dataparallel_enabled") is True:
            raise storage.JobFailure(
                "ClientError: SMDDP (sagemaker_distributed_dataparallel_enabled) needs SageMaker's "
                "smdistributed library on EFA-connected ml.p4d or ml.p4de instances, which the "
                "offline stack cannot provide: use distribution 'torch' (torchrun) here"
            )
        pool = self.settings.pool
        if self.plan.total > pool.size:
            raise storage.JobFailure(
                "CapacityError: Unable to provision requested ML compute capacity: "
                f"{self.plan.hosts} hosts need {self.plan.total} processes, and this machine runs "
                f"at most {pool.size} at once (max_processes)"
            )
        if not pool.acquire(
            self.plan.total,
            cancelled=job.stop_requested,
            on_wait=lambda: job.note(WAITING_FOR_CORES),
        ):
            raise _Stopped
        self._cores = self.plan.total
        self._enter("Downloading")
        script = self._download(hyperparameters)
        training = MESSAGES["Training"]
        if self.plan.note:
            log.warning("training job %s: %s", job.name, self.plan.note)
            training = f"{training} {self.plan.note}"
        self._enter("Training", training)
        self._launch(script, hyperparameters)
        return self._supervise()

    def _enter(self, status: str, message: str | None = None) -> None:
        if not self.job.advance(status, message):
            raise _Stopped

    # ------------------------------------------------------------- download --
    def _download(self, hyperparameters: dict[str, Any]) -> Path:
        request, s3 = self.job.request, self.settings.s3
        code_uri = hyperparameters.get("sagemaker_submit_directory")
        program = str(hyperparameters.get("sagemaker_program", "train.py"))
        isolated = request.get("EnableNetworkIsolation") is True
        # The container unpacks its code from a channel (as an isolated job must) or downloads it
        # from S3 itself, with the job's credentials: an isolated container has neither network
        # nor credentials, so on AWS that download fails when the script starts.
        in_channel = isinstance(code_uri, str) and code_uri.startswith(container.CHANNELS_IN_CONTAINER)
        if not in_channel and (not isinstance(code_uri, str) or not code_uri.startswith("s3://")):
            raise storage.JobFailure(
                "ClientError: the hyperparameter sagemaker_submit_directory must name the s3:// "
                f"URI of the code archive, or its path in a channel, not {code_uri!r}"
            )
        if not in_channel and isolated:
            raise storage.JobFailure(
                "AlgorithmError: the container could not download sagemaker_submit_directory "
                f"{code_uri}: with EnableNetworkIsolation it has no network and no AWS credentials; "
                f"deliver the code as an input channel (e.g. {container.CHANNELS_IN_CONTAINER}code/sourcedir.tar.gz)"
            )
        archive = self.root / "sourcedir.tar.gz"
        if not in_channel:
            storage.download_object(s3, str(code_uri), archive, what="sagemaker_submit_directory")
        hosts = [layout.name for layout in self.layouts]
        checkpoint_uri = request.get("CheckpointConfig", {}).get("S3Uri")
        for layout in self.layouts:
            layout.create()
            container.write_configuration(layout, hosts, request)
            for channel in request.get("InputDataConfig", []):
                source = channel["DataSource"].get("S3DataSource")
                if source is not None:
                    storage.download_prefix(
                        s3,
                        source["S3Uri"],
                        layout.channel(channel["ChannelName"]),
                        required=True,
                        role=request["RoleArn"],
                    )
            host_archive = layout.in_container(str(code_uri)) if in_channel else archive
            if not host_archive.is_file():
                raise storage.JobFailure(f"AlgorithmError: sagemaker_submit_directory {code_uri} is not in any channel")
            storage.unpack(host_archive, layout.code)
            if checkpoint_uri:
                storage.download_prefix(s3, checkpoint_uri, layout.checkpoints, required=False, role=request["RoleArn"])
        script = self.layouts[0].code / program
        if not script.is_file():
            raise storage.JobFailure(f"ClientError: {code_uri} has no {program} (the hyperparameter sagemaker_program)")
        return script

    # --------------------------------------------------------------- launch --
    def _launch(self, script: Path, hyperparameters: dict[str, Any]) -> None:
        request = self.job.request
        script_hps = container.script_hyperparameters(hyperparameters)
        torchrun = hyperparameters.get("sagemaker_torch_distributed_enabled") is True
        port = container.free_port()
        hosts = [layout.name for layout in self.layouts]
        cpus = container.cpus_per_host(len(hosts))
        if self.evaluations is not None:
            interval = request.get("ProfilerConfig", {}).get("ProfilingIntervalInMilliseconds")
            self.monitors = debugger.SystemMonitors(int(interval or 500))
        for rank, layout in enumerate(self.layouts):
            channels = {
                channel["ChannelName"]: self.mounts.get(channel["ChannelName"], layout.channel(channel["ChannelName"]))
                for channel in request.get("InputDataConfig", [])
            }
            env = container.container_environment(
                container.isolated(self.settings.base_environment)
                if request.get("EnableNetworkIsolation") is True
                else self.settings.base_environment,
                request,
                host=layout,
                hosts=hosts,
                channels=channels,
                hyperparameters=script_hps,
                cpus=cpus,
            )
            argv = container.launch_command(
                self.settings.python,
                layout.code / script.relative_to(self.layouts[0].code),
                container.script_arguments(script_hps, layout.checkpoints),
                torchrun=torchrun,
                plan=self.plan,
                node_rank=rank,
                master_port=port,
            )
            self.streams[rank].open()
            process = HostProcess(
                layout.name,
                argv,
                cwd=layout.code,
                env=env,
                log_file=layout.logs,
                on_line=self._line_handler(rank),
                preamble=["Invoking script with the following command:", shlex.join(argv)],
            )
            self.hosts.append(process)
            if self.monitors is not None:
                self.monitors.start(layout.debugger, layout.name, process.pid)
            log.info("training job %s: %s started %s", self.job.name, layout.name, argv)

    def _line_handler(self, rank: int) -> Callable[[str], None]:
        stream = self.streams[rank]

        def handle(line: str) -> None:
            stream.add(line)
            if rank == 0:
                self._scrape(line)

        return handle

    def _scrape(self, line: str) -> None:
        """SageMaker applies each MetricDefinitions regex to each line of algo-1's log."""
        for name, pattern in self.metrics:
            match = pattern.search(line)
            if match is None:
                continue
            try:
                value = float(match.group(1) if pattern.groups else match.group(0))
            except (ValueError, IndexError):
                continue
            with self._values_lock:
                self._last_values[name] = {"MetricName": name, "Value": value, "Timestamp": now()}

    # ------------------------------------------------------------ supervise --
    def _supervise(self) -> Outcome:
        job = self.job
        limit = job.request.get("StoppingCondition", {}).get("MaxRuntimeInSeconds")
        started = time.monotonic()
        last_flush = started
        while True:
            codes = []
            for host in self.hosts:
                code = host.poll()
                if code is None:
                    host.refresh()
                codes.append(code)
            for host, code in zip(self.hosts, codes, strict=True):
                if code not in (None, 0):
                    return self._host_failed(host, code)
            if all(code == 0 for code in codes):
                return Outcome("Completed")
            if job.stop_requested.is_set():
                return Outcome("Stopped")
            if limit is not None and time.monotonic() - started > float(limit):
                job.request_stop("MaxRuntimeExceeded")
                return Outcome("Stopped")
            if time.monotonic() - last_flush >= LOG_FLUSH_SECONDS:
                self._flush_logs()
                last_flush = time.monotonic()
            job.stop_requested.wait(POLL_SECONDS)

    def _host_failed(self, failed: HostProcess, code: int) -> Outcome:
        # The reason needs the failed host's whole stderr: end every host and drain them first.
        self._end_hosts()
        layout = self.layouts[self.hosts.index(failed)]
        log.warning("training job %s: %s exited with %d", self.job.name, failed.name, code)
        return Outcome("Failed", container.failure_reason(code, failed.stderr_tail, layout.failure))

    def _end_hosts(self) -> None:
        """SIGTERM to every host still running, SIGKILL to what outlives the grace period."""
        if self._hosts_ended:
            return
        self._hosts_ended = True
        stopping = time.monotonic()
        for host in self.hosts:
            host.terminate()
        while any(host.alive() for host in self.hosts):
            if time.monotonic() - stopping >= self.grace:
                break
            for host in self.hosts:
                if host.poll() is None:
                    host.refresh()
            time.sleep(0.1)
        for host in self.hosts:
            if host.alive():
                log.warning("%s outlived SIGTERM by %.0f s: killing it", host.name, self.grace)
                host.kill()
        killed = time.monotonic()
        while any(host.alive() for host in self.hosts):
            if time.monotonic() - killed > KILL_WAIT_SECONDS:
                log.error("processes of training job %s are still running", self.job.name)
                break
            time.sleep(0.05)
        for host in self.hosts:
            host.close()

    # ------------------------------------------------------------ wind down --
    def _wind_down(self, outcome: Outcome) -> Outcome:
        """Processes gone, cores back, logs sent, then SageMaker's uploads for this outcome."""
        if self.hosts:
            self._end_hosts()
        self._release_cores()
        if self.monitors is not None:
            self.monitors.stop()
        self._flush_logs()
        with self._values_lock:
            self.job.final_metrics = list(self._last_values.values())
        if not self.hosts:
            return outcome
        if outcome.status == "Completed" and not self.job.advance("Uploading"):
            outcome = Outcome("Stopped")
        try:
            self._upload(outcome)
        except Exception as error:
            log.exception("training job %s: the upload failed", self.job.name)
            return Outcome("Failed", f"ClientError: uploading the job's output failed: {error}")
        return outcome

    def _upload(self, outcome: Outcome) -> None:
        request, s3 = self.job.request, self.settings.s3
        base = storage.join_uri(request["OutputDataConfig"]["S3OutputPath"], self.job.name)
        leader = self.layouts[0]
        # Rank 0 writes the model and the output; SageMaker uploads the leader's folders.
        if outcome.status != "Failed":
            storage.upload_tarball(
                s3,
                leader.model,
                self.root / "upload" / "model.tar.gz",
                storage.join_uri(base, "output", "model.tar.gz"),
            )
        if outcome.status != "Failed" or storage.has_files(leader.output_data):
            storage.upload_tarball(
                s3,
                leader.output_data,
                self.root / "upload" / "output.tar.gz",
                storage.join_uri(base, "output", "output.tar.gz"),
            )
        checkpoint_uri = request.get("CheckpointConfig", {}).get("S3Uri")
        if checkpoint_uri:
            # The leader last: where hosts wrote the same file, its copy is the one kept.
            for layout in reversed(self.layouts):
                storage.upload_folder(s3, layout.checkpoints, checkpoint_uri)
        if self.monitors is not None:
            profiler = request.get("ProfilerConfig", {})
            system_base = storage.join_uri(
                profiler.get("S3OutputPath") or request["OutputDataConfig"]["S3OutputPath"],
                self.job.name,
                "profiler-output",
                "system",
            )
            for layout in self.layouts:
                system = layout.debugger / "profile" / "system"
                if system.is_dir():
                    storage.upload_folder(s3, system, system_base)

    def _evaluate_rules(self, outcome: Outcome) -> None:
        """The rule jobs outlive the training job: they judge what the monitors recorded."""
        evaluations = self.evaluations
        if evaluations is None or outcome.status == "Stopped":
            return
        request = self.job.request
        ended = self.job.ended or now()
        started = self.job.started or ended
        data = debugger.load_profile(
            [layout.debugger for layout in self.layouts],
            started=started.timestamp(),
            ended=ended.timestamp(),
        )
        out_dir = self.root / "rule-output"
        shutil.rmtree(out_dir, ignore_errors=True)
        metrics = _read_json(self.layouts[0].output_data / "metrics.json")
        try:
            verdicts = debugger.evaluate_rules(
                request["ProfilerRuleConfigurations"],
                data,
                out_dir,
                job_name=self.job.name,
                metrics=metrics,
            )
            if out_dir.is_dir():
                base = request["OutputDataConfig"]["S3OutputPath"]
                uri = storage.join_uri(base, self.job.name, "rule-output")
                storage.upload_folder(self.settings.s3, out_dir, uri)
        except Exception as error:  # a rule job's failure is its own, not the training job's
            log.exception("training job %s: the rule evaluation failed", self.job.name)
            detail = f"InternalServerError: {type(error).__name__}: {error}"
            verdicts = dict.fromkeys(evaluations.names, ("Error", detail))
        evaluations.publish(verdicts, now())

    # -------------------------------------------------------------- helpers --
    def _release_cores(self) -> None:
        if self._cores:
            self.settings.pool.release(self._cores)
            self._cores = 0

    def _flush_logs(self) -> None:
        for stream in self.streams:
            stream.flush()

    def request_shutdown(self, grace: float) -> None:
        """The emulator is shutting down: stop this job, with at most `grace` seconds of SIGTERM."""
        self.grace = min(self.grace, grace)
        self.job.request_stop("Stopped")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None
