"""The offline stack runs SageMaker training jobs as SageMaker would: the real trainer from the
real sourcedir.tar.gz, under torchrun, with SageMaker's folders, variables, statuses and uploads,
so whatever polls DescribeTrainingJob sees what it would see on AWS.

Every test talks to the emulator through a real boto3 sagemaker client (moto plus the emulator
registry, as the offline stack wires them), with requests built by the functions' own builder.
Tests that run the trainer (or torchrun) are marked slow; each took, on two shared cores: one
host 6 s, two hosts 6 s, a failing trainer 4 s, a stop 5 s, Debugger rules 11 s, waiting for a
core 4 s, the runtime limit 13 s, the container contract 2 s; the rest take well under a second.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import botocore.session
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from moto import mock_aws

from functions.common.contracts import MetricsFile
from functions.common.debugger import normalise_debugger_results, read_profiler_reports
from functions.common.rules import RulesFile
from functions.common.service_model import service_side_problems
from functions.training_job.builder import TrainingRun, build_training_job_request
from retrain.local.endpoint.emulators import EmulatedServiceError, EmulatorRegistry
from retrain.local.sagemaker.container import plan_processes
from retrain.local.sagemaker.debugger import PROFILER_REPORT_RULES
from retrain.local.sagemaker.processes import identity
from retrain.local.sagemaker.training import TrainingEmulator
from retrain.package import TrainerArchive, build_sourcedir
from retrain.synth import write_scenes
from tests.unit.training_job.helpers import ACCOUNT, BUCKET, RUN, SETTINGS, job_config

REGION = SETTINGS["region"]
CODE_URI = SETTINGS["code_s3_uri"]
FAKE_CODE_URI = f"s3://{BUCKET}/code/contract-probe.tar.gz"
MISSING_CODE_URI = f"s3://{BUCKET}/code/nothing-here.tar.gz"
SCENES, SCENE_SIZE = 24, (64, 32)
# The smallest run tests/trainer/ uses: one or two steps of a quarter-width BiSeNetV2.
TINY = {
    "width": 0.25,
    "crop": "64x32",
    "batch-size": 4,
    "epochs": 1,
    "lr": 0.1,
    "workers": 0,
    "log-every": 0,
    "checkpoint-every-seconds": 0,
}
TERMINAL = {"Completed", "Failed", "Stopped"}
DESCRIBE_SHAPE = (
    botocore.session.get_session().get_service_model("sagemaker").operation_model("DescribeTrainingJob").output_shape
)

# A stand-in for the trainer, to watch the container contract and the launcher cheaply: it
# reports what it was given, then waits for a release file (or forever), as flags say.
PROBE = r"""
import argparse, json, os, pathlib, signal, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--release", default="")
parser.add_argument("--ignore-sigterm", default="False")
parser.add_argument("--fail-with", default="")
parser.add_argument("--checkpoint-dir")
args, _ = parser.parse_known_args()
if args.ignore_sigterm == "True":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(f"started {time.time()}", flush=True)
model = pathlib.Path(os.environ["SM_CHANNEL_MODEL"]) if "SM_CHANNEL_MODEL" in os.environ else None
report = {
    "argv": sys.argv[1:],
    "cwd": os.getcwd(),
    "env": {k: v for k, v in os.environ.items() if k.startswith("SM_") or k == "OMP_NUM_THREADS"},
    "aws": sorted(k for k in os.environ
                  if k.startswith(("AWS_ACCESS", "AWS_SECRET", "AWS_SESSION", "AWS_ENDPOINT", "AWS_PROFILE"))),
    "model_channel": sorted(str(p.relative_to(model)) for p in model.rglob("*") if p.is_file())
    if model else [],
    "restored": sorted(p.name for p in pathlib.Path(args.checkpoint_dir).iterdir()),
}
out = pathlib.Path(os.environ["SM_OUTPUT_DATA_DIR"])
(out / "contract.json").write_text(json.dumps(report))
pathlib.Path(args.checkpoint_dir, "written-by-the-job.txt").write_text("step 7")
if args.fail_with:
    pathlib.Path(os.environ["SM_OUTPUT_DIR"], "failure").write_text(args.fail_with)
    sys.exit(3)
while not (args.release and pathlib.Path(args.release).exists()):
    time.sleep(0.05)
pathlib.Path(os.environ["SM_MODEL_DIR"], "model.txt").write_text("probe")
print(f"ended {time.time()}", flush=True)
"""


@dataclass
class Offline:
    emulator: TrainingEmulator
    registry: EmulatorRegistry
    sagemaker: Any
    s3: Any
    logs: Any
    workdir: Path
    scenes: Path

    def create(self, request: dict[str, Any]) -> str:
        self.sagemaker.create_training_job(**request)
        return str(request["TrainingJobName"])

    def describe(self, name: str) -> dict[str, Any]:
        answer = dict(self.sagemaker.describe_training_job(TrainingJobName=name))
        answer.pop("ResponseMetadata")
        # Stricter than the registry's check: maxima, patterns and enums too.
        assert service_side_problems(answer, DESCRIBE_SHAPE) == [], answer
        return answer

    def until(self, name: str, condition: Callable[[dict[str, Any]], bool], timeout: float = 120):
        """Describe until `condition` holds (a wait for a state, not a timing assertion)."""
        deadline = time.monotonic() + timeout
        while True:
            answer = self.describe(name)
            if condition(answer):
                return answer
            assert answer["TrainingJobStatus"] not in TERMINAL, answer.get("FailureReason")
            assert time.monotonic() < deadline, f"{name}: still {answer['SecondaryStatus']}"
            time.sleep(0.1)

    def s3_object(self, uri: str) -> bytes:
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        return bytes(self.s3.get_object(Bucket=bucket, Key=key)["Body"].read())

    def keys(self, prefix: str) -> list[str]:
        found = self.s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
        return [item["Key"] for item in found]


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The FSx mount: `dataset/` with images, labels and the run's manifest."""
    folder = tmp_path_factory.mktemp("fsx") / "dataset"
    write_scenes(folder, count=SCENES, size=SCENE_SIZE, seed=1, version=RUN.dataset_version)
    return folder


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> TrainerArchive:
    return build_sourcedir(tmp_path_factory.mktemp("sourcedir"))


def _probe_archive() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = PROBE.encode()
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture
def offline(tmp_path: Path, scenes: Path, archive: TrainerArchive) -> Iterator[Callable[..., Offline]]:
    """Moto with a versioned bucket holding both archives; `offline(**options)` starts the
    emulator. At the end every job is stopped and none of their processes may be left."""
    started: list[Offline] = []

    def resolve(file_system_id: str, directory: str) -> Path:
        if (file_system_id, directory) != (SETTINGS["fsx_file_system_id"], "/abcdefgh/dataset"):
            raise EmulatedServiceError("ValidationException", f"FileSystem {file_system_id} was not found")
        return scenes

    with mock_aws():
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        s3.upload_file(str(archive.path), BUCKET, CODE_URI.split("/", 3)[3])
        s3.put_object(Bucket=BUCKET, Key=FAKE_CODE_URI.split("/", 3)[3], Body=_probe_archive())
        registry = EmulatorRegistry()

        def start(**options: Any) -> Offline:
            assert not started, "one emulator per test"
            workdir = tmp_path / "work"
            emulator = TrainingEmulator(
                s3=s3,
                logs=boto3.client("logs", region_name=REGION),
                workdir=workdir,
                region=REGION,
                account_id=ACCOUNT,
                resolve_file_system=resolve,
                **{"max_processes": 2, "stop_grace_seconds": 3.0, **options},
            )
            emulator.register(registry)
            registry.install()
            sagemaker = boto3.client("sagemaker", region_name=REGION, config=Config(retries={"max_attempts": 1}))
            logs = boto3.client("logs", region_name=REGION)
            started.append(Offline(emulator, registry, sagemaker, s3, logs, workdir, scenes))
            return started[0]

        try:
            yield start
        finally:
            for running in started:
                jobs = [call[2]["TrainingJobName"] for call in registry.calls if "TrainingJobName" in call[2]]
                running.emulator.stop_all(timeout=30)
                for name in set(jobs):
                    try:
                        pids = running.emulator.pids(name)
                    except KeyError:
                        continue
                    assert [pid for pid in pids if identity(pid) is not None] == [], name
            registry.uninstall()


def _request(code_uri: str = CODE_URI, execution: str = "run-1", **changes: Any) -> dict[str, Any]:
    config = job_config(**{"hyperparameters": TINY, **changes})
    run = TrainingRun(dataset_version=RUN.dataset_version, execution=execution, code_s3_uri=code_uri)
    return build_training_job_request(config, run)


def _members(blob: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        return {
            member.name: tar.extractfile(member).read()  # type: ignore[union-attr]
            for member in tar.getmembers()
            if member.isfile()
        }


def _statuses(answer: dict[str, Any]) -> list[str]:
    return [item["Status"] for item in answer["SecondaryStatusTransitions"]]


# ------------------------------------------------------------------ real training runs --
@pytest.mark.slow(seconds=10)
def test_a_one_host_job_trains_and_uploads_model_output_checkpoints_and_metrics(
    offline: Callable[..., Offline],
) -> None:
    aws = offline()
    request = _request()
    answer = aws.sagemaker.create_training_job(**request)
    name = request["TrainingJobName"]
    assert answer["TrainingJobArn"] == (f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{name.lower()}")
    first = aws.describe(name)
    assert first["TrainingJobStatus"] == "InProgress"
    assert isinstance(first["CreationTime"], datetime)
    assert "ProfilerRuleEvaluationStatuses" not in first, "no rules were asked for"

    aws.emulator.wait(name, timeout=240)
    done = aws.describe(name)
    assert done["TrainingJobStatus"] == "Completed", done.get("FailureReason")
    assert _statuses(done) == ["Starting", "Downloading", "Training", "Uploading", "Completed"]
    assert done["CreationTime"] <= done["TrainingStartTime"] <= done["TrainingEndTime"]
    assert done["TrainingTimeInSeconds"] >= 1 and done["BillableTimeInSeconds"] >= 1
    for key in (
        "HyperParameters",
        "Environment",
        "CheckpointConfig",
        "ProfilerConfig",
        "VpcConfig",
    ):
        assert done[key] == request[key], key
    assert done["InputDataConfig"][0]["DataSource"] == request["InputDataConfig"][0]["DataSource"]
    assert done["ProfilingStatus"] == "Disabled"
    assert "ProfilerRuleEvaluationStatuses" not in done

    model = _members(aws.s3_object(done["ModelArtifacts"]["S3ModelArtifacts"]))
    output_uri = done["ModelArtifacts"]["S3ModelArtifacts"].replace("model.tar.gz", "output.tar.gz")
    output = _members(aws.s3_object(output_uri))
    assert {"model.pt", "metrics.json"} <= set(model), sorted(model)
    assert {"metrics.json", "rules.json", "report.html"} <= set(output), sorted(output)
    metrics = MetricsFile.model_validate_json(output["metrics.json"])
    assert metrics.complete and metrics.host.world_size == 1
    assert metrics.dataset_version == RUN.dataset_version
    # The FSx mount itself is the train channel: read in place, never copied.
    assert metrics.config["data_dir"] == str(aws.scenes)
    host = aws.workdir / name / "algo-1"
    assert not (host / "input" / "data" / "train").exists()

    final = {item["MetricName"]: item["Value"] for item in done["FinalMetricDataList"]}
    assert final["validation:miou"] == pytest.approx(metrics.miou, abs=1e-4)
    assert final["epoch"] == 1.0 and "train:loss" in final

    checkpoints = request["CheckpointConfig"]["S3Uri"].removeprefix(f"s3://{BUCKET}/")
    assert aws.keys(checkpoints), "the checkpoints were not synced to CheckpointConfig.S3Uri"
    config = json.loads((host / "input" / "config" / "hyperparameters.json").read_text())
    assert config == request["HyperParameters"]
    assert "METRIC" in (host / "logs.txt").read_text()
    [stream] = aws.logs.describe_log_streams(logGroupName="/aws/sagemaker/TrainingJobs")["logStreams"]
    assert stream["logStreamName"].startswith(f"{name}/algo-1-")
    events = aws.logs.get_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream["logStreamName"])[
        "events"
    ]
    assert any(event["message"].startswith("METRIC ") for event in events)


@pytest.mark.slow(seconds=5)
def test_two_hosts_train_as_one_process_group_each_with_its_folder_and_log(
    offline: Callable[..., Offline],
) -> None:
    aws = offline(max_processes=2)
    request = _request(instance_type="ml.g5.12xlarge", instance_count=2)
    name = aws.create(request)
    done = aws.emulator.wait(name, timeout=240)
    assert done["TrainingJobStatus"] == "Completed", done.get("FailureReason")

    training = next(t for t in done["SecondaryStatusTransitions"] if t["Status"] == "Training")
    cap = "ml.g5.12xlarge has 4 GPUs: this machine has 2 cores, so 1 process per host (2 hosts)"
    assert cap in training["StatusMessage"]
    output = _members(
        aws.s3_object(done["ModelArtifacts"]["S3ModelArtifacts"].replace("model.tar.gz", "output.tar.gz"))
    )
    metrics = MetricsFile.model_validate_json(output["metrics.json"])
    host = metrics.host.model_dump()
    assert (host["world_size"], host["local_world_size"]) == (2, 1)
    assert host["hosts"] == ["algo-1", "algo-2"] and host["current_host"] == "algo-1"
    for rank, host in enumerate(("algo-1", "algo-2")):
        folder = aws.workdir / name / host
        resource = json.loads((folder / "input/config/resourceconfig.json").read_text())
        assert resource["current_host"] == host and resource["hosts"] == ["algo-1", "algo-2"]
        log = (folder / "logs.txt").read_text()
        assert f"--nnodes 2 --node-rank {rank} --nproc-per-node 1" in log, log[:500]
    streams = aws.logs.describe_log_streams(logGroupName="/aws/sagemaker/TrainingJobs")
    names = sorted(item["logStreamName"].rsplit("-", 1)[0] for item in streams["logStreams"])
    assert names == [f"{name}/algo-1", f"{name}/algo-2"]


@pytest.mark.slow(seconds=5)
def test_a_trainer_that_refuses_its_hyperparameters_fails_the_job_with_its_own_words(
    offline: Callable[..., Offline],
) -> None:
    aws = offline()
    name = aws.create(_request(hyperparameters={**TINY, "batch-size": 1}))
    done = aws.emulator.wait(name, timeout=120)
    assert done["TrainingJobStatus"] == "Failed" and done["SecondaryStatus"] == "Failed"
    reason = done["FailureReason"]
    assert reason.startswith("AlgorithmError: ") and len(reason) <= 1024
    assert "--batch-size must be at least 2" in reason, reason
    assert "ChildFailedError" not in reason, "torchrun's own report says nothing of the cause"
    assert _statuses(done)[-1] == "Failed"
    assert aws.keys(f"training/{name}/output/model.tar.gz") == [], "a failed job has no model"


@pytest.mark.slow(seconds=5)
def test_stopping_a_running_job_ends_every_process_it_started(
    offline: Callable[..., Offline],
) -> None:
    aws = offline(stop_grace_seconds=5.0)
    name = aws.create(_request(hyperparameters={**TINY, "epochs": 500}))
    aws.until(name, lambda answer: answer["SecondaryStatus"] == "Training")
    log = aws.workdir / name / "algo-1" / "logs.txt"
    deadline = time.monotonic() + 120
    while "steps/epoch" not in log.read_text():  # the trainer's first words once it has data
        assert time.monotonic() < deadline, "the trainer never started"
        time.sleep(0.1)
    assert len(aws.emulator.pids(name)) >= 2, "torchrun and its worker"
    job_folder = str(aws.workdir / name)
    running = _pids_mentioning(job_folder)
    assert len(running) >= 2, "no process names the job's folder"

    aws.sagemaker.stop_training_job(TrainingJobName=name)
    assert aws.describe(name)["TrainingJobStatus"] == "Stopping"
    done = aws.emulator.wait(name, timeout=120)
    assert done["TrainingJobStatus"] == "Stopped" and done["SecondaryStatus"] == "Stopped"
    assert _statuses(done)[-2:] == ["Stopping", "Stopped"]
    gone = [*aws.emulator.pids(name), *running]
    assert [pid for pid in gone if identity(pid) is not None] == []
    assert _pids_mentioning(job_folder) == []
    assert aws.keys(f"training/{name}/output/model.tar.gz"), "a stopped job uploads its model"

    with pytest.raises(ClientError) as again:
        aws.sagemaker.stop_training_job(TrainingJobName=name)
    assert again.value.response["Error"] == {
        "Code": "ValidationException",
        "Message": "The request was rejected because the training job is in status Stopped.",
    }


def _pids_mentioning(text: str) -> list[int]:
    """Processes whose command line names `text` (Linux /proc; zombies do not count)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            command = entry.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in command and identity(int(entry.name)) is not None:
            found.append(int(entry.name))
    return found


@pytest.mark.slow(seconds=15)
def test_debugger_rules_stay_in_progress_after_the_job_then_give_verdicts_the_functions_read(
    offline: Callable[..., Offline],
) -> None:
    delay = 5.0
    aws = offline(rule_delay_seconds=delay)
    request = _request(profiling="debugger")
    name = aws.create(request)
    configured = [rule["RuleConfigurationName"] for rule in request["ProfilerRuleConfigurations"]]
    early = aws.describe(name)
    assert early["ProfilingStatus"] == "Enabled"
    assert [item["RuleConfigurationName"] for item in early["ProfilerRuleEvaluationStatuses"]] == (configured)
    assert {item["RuleEvaluationStatus"] for item in early["ProfilerRuleEvaluationStatuses"]} == {"InProgress"}

    aws.emulator.wait(name, timeout=240)
    # (answered, statuses): the emulator judged at some moment before `answered`.
    seen: list[tuple[datetime, set[str]]] = []
    while True:
        answer = aws.describe(name)
        answered = datetime.now(UTC)
        statuses = {item["RuleEvaluationStatus"] for item in answer["ProfilerRuleEvaluationStatuses"]}
        seen.append((answered, statuses))
        if statuses != {"InProgress"}:
            break
        assert answered < answer["TrainingEndTime"] + timedelta(seconds=delay + 60), "never final"
        time.sleep(0.2)
    assert answer["TrainingJobStatus"] == "Completed", answer.get("FailureReason")
    final_at = answer["TrainingEndTime"] + timedelta(seconds=delay)
    assert seen[0][1] == {"InProgress"}, "the rules were final as soon as the job ended"
    assert all(observed == {"InProgress"} for moment, observed in seen if moment < final_at)
    assert seen[-1][0] >= final_at, "a verdict came before the rule jobs' delay was over"
    assert statuses <= {"NoIssuesFound", "IssuesFound"}, answer["ProfilerRuleEvaluationStatuses"]

    reports = read_profiler_reports(aws.s3, answer)
    assert set(PROFILER_REPORT_RULES) <= set(reports), sorted(reports)
    rules = normalise_debugger_results(answer, reports, generated_at=datetime.now(UTC))
    assert isinstance(rules, RulesFile) and rules.backend == "debugger"
    assert RulesFile.model_validate_json(rules.model_dump_json()) == rules
    assert [rule.name for rule in rules.rules][: len(configured)] == configured
    assert set(PROFILER_REPORT_RULES) <= {rule.name for rule in rules.rules}
    assert not [rule.name for rule in rules.rules if rule.pending]
    assert rules.report_uri is not None and b"<html" in aws.s3_object(rules.report_uri)
    # Debugger's monitor wrote beside the job, not into its output; the trainer stayed out.
    output = _members(
        aws.s3_object(answer["ModelArtifacts"]["S3ModelArtifacts"].replace("model.tar.gz", "output.tar.gz"))
    )
    assert "rules.json" not in output and not [path for path in output if path.startswith("profile/")]
    assert aws.keys(f"training/{name}/profiler-output/system/algo-1.jsonl")


# --------------------------------------------------------- the launcher, with a probe --
@pytest.mark.slow(seconds=5)
def test_the_script_gets_the_sagemaker_container_contract_and_its_failure_file_is_the_reason(
    offline: Callable[..., Offline],
) -> None:
    aws = offline()
    aws.s3.put_object(Bucket=BUCKET, Key="models/accepted/model.pt", Body=b"weights")
    aws.s3.put_object(Bucket=BUCKET, Key="models/accepted/extra/notes.txt", Body=b"notes")
    request = _request(
        FAKE_CODE_URI,
        hyperparameters={"fail-with": "the probe saw everything", "epochs": 3},
        model_s3_uri=f"s3://{BUCKET}/models/accepted",
    )
    checkpoints = request["CheckpointConfig"]["S3Uri"].removeprefix(f"s3://{BUCKET}/")
    aws.s3.put_object(Bucket=BUCKET, Key=f"{checkpoints}/checkpoint-000000005.pt", Body=b"ckpt")
    name = aws.create(request)
    done = aws.emulator.wait(name, timeout=120)

    assert done["TrainingJobStatus"] == "Failed"
    assert done["FailureReason"] == "AlgorithmError: the probe saw everything"
    # SageMaker uploads output.tar.gz and the checkpoints of a failed job too.
    output = _members(aws.s3_object(f"s3://{BUCKET}/training/{name}/output/output.tar.gz"))
    seen = json.loads(output["contract.json"])
    host = aws.workdir / name / "algo-1"
    assert seen["argv"] == [
        "--backend",
        "torch",
        "--dataset-version",
        RUN.dataset_version,
        "--epochs",
        "3",
        "--fail-with",
        "the probe saw everything",
        "--checkpoint-dir",
        str(host / "checkpoints"),
    ]
    assert seen["cwd"] == str(host / "code")
    env = seen["env"]
    assert env["SM_CHANNEL_TRAIN"] == str(aws.scenes)
    assert env["SM_CHANNEL_MODEL"] == str(host / "input" / "data" / "model")
    # Isolated (the default), the code arrives as a channel and no credentials reach the script.
    assert json.loads(env["SM_CHANNELS"]) == ["code", "model", "train"]
    assert seen["aws"] == [], "an isolated container has no AWS credentials or endpoint"
    assert done["EnableNetworkIsolation"] is True
    assert env["SM_MODEL_DIR"] == str(host / "model")
    assert env["SM_OUTPUT_DATA_DIR"] == str(host / "output" / "data")
    assert env["SM_CURRENT_HOST"] == "algo-1" and json.loads(env["SM_HOSTS"]) == ["algo-1"]
    assert env["SM_NUM_GPUS"] == "0" and env["OMP_NUM_THREADS"] == "1"
    assert json.loads(env["SM_HPS"])["epochs"] == 3
    assert not [key for key in json.loads(env["SM_HPS"]) if key.startswith("sagemaker_")]
    training_env = json.loads(env["SM_TRAINING_ENV"])
    assert (training_env["job_name"], training_env["current_host"]) == (name, "algo-1")
    assert seen["model_channel"] == ["extra/notes.txt", "model.pt"]
    assert seen["restored"] == ["checkpoint-000000005.pt"]
    assert f"{checkpoints}/written-by-the-job.txt" in aws.keys(checkpoints)
    assert aws.keys(f"training/{name}/output/model.tar.gz") == []


@pytest.mark.slow(seconds=5)
def test_a_second_job_waits_for_a_free_core_rather_than_oversubscribing(
    offline: Callable[..., Offline], tmp_path: Path
) -> None:
    aws = offline(max_processes=1)
    release = tmp_path / "release"
    names = [
        aws.create(_request(FAKE_CODE_URI, execution=f"run-{n}", hyperparameters={"release": str(release)}))
        for n in (1, 2)
    ]
    deadline = time.monotonic() + 120
    while not (training := [n for n in names if aws.describe(n)["SecondaryStatus"] == "Training"]):
        assert time.monotonic() < deadline, "neither job started training"
        time.sleep(0.1)
    [running] = training
    [queued] = [name for name in names if name != running]
    waiting = aws.describe(queued)
    assert waiting["SecondaryStatus"] == "Starting"
    assert waiting["SecondaryStatusTransitions"][-1]["StatusMessage"] == ("waiting for a free core on this machine")
    release.touch()
    for name in (running, queued):
        assert aws.emulator.wait(name, timeout=120)["TrainingJobStatus"] == "Completed"

    def span(name: str) -> tuple[float, float]:
        words = dict(
            line.split(" ", 1)
            for line in (aws.workdir / name / "algo-1" / "logs.txt").read_text().splitlines()
            if line.startswith(("started ", "ended "))
        )
        return float(words["started"]), float(words["ended"])

    assert span(running)[1] < span(queued)[0], "the two jobs' scripts ran at the same time"


@pytest.mark.slow(seconds=15)
def test_a_job_past_its_runtime_limit_is_stopped_even_when_it_ignores_sigterm(
    offline: Callable[..., Offline], caplog: pytest.LogCaptureFixture
) -> None:
    aws = offline(stop_grace_seconds=2.0, rule_delay_seconds=0.0)
    request = _request(
        FAKE_CODE_URI,
        hyperparameters={"ignore-sigterm": True},
        max_runtime_seconds=10,
        profiling="debugger",
    )
    name = aws.create(request)
    done = aws.emulator.wait(name, timeout=120)
    assert done["TrainingJobStatus"] == "Stopped"
    assert done["SecondaryStatus"] == "MaxRuntimeExceeded"
    assert _statuses(done)[-2:] == ["Stopping", "MaxRuntimeExceeded"]
    rules = aws.describe(name)["ProfilerRuleEvaluationStatuses"]
    assert {item["RuleEvaluationStatus"] for item in rules} == {"Stopped"}, "a stopped job's rules"
    assert "started " in (aws.workdir / name / "algo-1" / "logs.txt").read_text()
    assert any("outlived SIGTERM" in record.getMessage() for record in caplog.records)
    pids = aws.emulator.pids(name)
    assert len(pids) >= 2, "the worker was never seen"
    assert [pid for pid in pids if identity(pid) is not None] == []


# ------------------------------------------------------------- the API's own answers --
def test_a_missing_code_archive_fails_the_job_naming_its_uri(
    offline: Callable[..., Offline],
) -> None:
    aws = offline()
    name = aws.create(_request(MISSING_CODE_URI))
    done = aws.emulator.wait(name, timeout=30)
    assert done["TrainingJobStatus"] == "Failed"
    assert done["FailureReason"].startswith("ClientError: ")
    assert MISSING_CODE_URI in done["FailureReason"]
    assert _statuses(done) == ["Starting", "Downloading", "Failed"]
    assert aws.emulator.pids(name) == []


def test_an_isolated_job_that_must_download_its_own_code_fails_as_on_aws(
    offline: Callable[..., Offline],
) -> None:
    aws = offline()
    request = _request(FAKE_CODE_URI)
    # As a request built without the `code` channel would be: the container fetches the code.
    request["HyperParameters"]["sagemaker_submit_directory"] = json.dumps(FAKE_CODE_URI)
    request["InputDataConfig"] = [c for c in request["InputDataConfig"] if c["ChannelName"] != "code"]
    name = aws.create(request)
    done = aws.emulator.wait(name, timeout=30)

    assert done["TrainingJobStatus"] == "Failed"
    assert done["FailureReason"].startswith("AlgorithmError: "), done["FailureReason"]
    assert "EnableNetworkIsolation" in done["FailureReason"] and FAKE_CODE_URI in done["FailureReason"]
    assert aws.emulator.pids(name) == []


def test_a_training_job_name_is_used_once(offline: Callable[..., Offline]) -> None:
    aws = offline()
    request = _request(MISSING_CODE_URI)
    name = aws.create(request)
    aws.emulator.wait(name, timeout=30)
    with pytest.raises(ClientError) as refused:
        aws.sagemaker.create_training_job(**request)
    error = refused.value.response["Error"]
    assert error["Code"] == "ResourceInUse"
    assert error["Message"].startswith("Training job names must be unique within an AWS account and region")
    creates = [call for call in aws.registry.calls if call[1] == "CreateTrainingJob"]
    assert len(creates) == 2 and aws.describe(name)["TrainingJobStatus"] == "Failed"


def test_a_throttled_create_runs_nothing_and_the_next_attempt_creates_one_job(
    offline: Callable[..., Offline],
) -> None:
    aws = offline()
    aws.emulator.throttle("CreateTrainingJob", times=2)
    request = _request(MISSING_CODE_URI)
    # A caller that does not retry sees each throttled answer, and nothing created behind it.
    no_retries = boto3.client("sagemaker", region_name=REGION, config=Config(retries={"total_max_attempts": 1}))
    for _ in range(2):
        with pytest.raises(ClientError) as throttled:
            no_retries.create_training_job(**request)
        assert throttled.value.response["Error"]["Code"] == "ThrottlingException"
        assert throttled.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        with pytest.raises(ClientError) as missing:
            aws.sagemaker.describe_training_job(TrainingJobName=request["TrainingJobName"])
        assert missing.value.response["Error"]["Message"] == "Requested resource not found."
    name = aws.create(request)
    assert aws.emulator.wait(name, timeout=30)["TrainingJobArn"].endswith(name.lower())
    with pytest.raises(ClientError) as again:
        aws.sagemaker.create_training_job(**request)
    assert again.value.response["Error"]["Code"] == "ResourceInUse", "more than one job"


def test_botocore_standard_retries_get_past_a_throttled_create(
    offline: Callable[..., Offline],
) -> None:
    aws = offline()
    aws.emulator.throttle("CreateTrainingJob", times=2)
    client = boto3.client(
        "sagemaker",
        region_name=REGION,
        config=Config(retries={"mode": "standard", "max_attempts": 5}),
    )
    request = _request(MISSING_CODE_URI)
    answer = client.create_training_job(**request)
    assert answer["ResponseMetadata"]["RetryAttempts"] == 2
    assert len([c for c in aws.registry.calls if c[1] == "CreateTrainingJob"]) == 3


def test_describe_and_stop_answer_as_aws_for_unknown_jobs_and_injected_failures(
    offline: Callable[..., Offline],
) -> None:
    aws = offline()
    for call in (aws.sagemaker.describe_training_job, aws.sagemaker.stop_training_job):
        with pytest.raises(ClientError) as unknown:
            call(TrainingJobName="retrain-no-such-job")
        assert unknown.value.response["Error"] == {
            "Code": "ValidationException",
            "Message": "Requested resource not found.",
        }
    name = aws.create(_request(MISSING_CODE_URI))
    aws.emulator.wait(name, timeout=30)
    aws.emulator.fail_describe("InternalFailure", "An internal error occurred", status=500)
    with pytest.raises(ClientError) as failed:
        aws.sagemaker.describe_training_job(TrainingJobName=name)
    assert failed.value.response["Error"]["Code"] == "InternalFailure"
    assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500


def test_a_job_without_profiler_rules_has_no_rule_statuses(
    offline: Callable[..., Offline],
) -> None:
    aws = offline()
    request = _request(MISSING_CODE_URI)
    assert "ProfilerRuleConfigurations" not in request
    name = aws.create(request)
    for answer in (aws.describe(name), aws.emulator.wait(name, timeout=30)):
        assert "ProfilerRuleEvaluationStatuses" not in answer
        assert answer["ProfilingStatus"] == "Disabled"


def test_an_unknown_file_system_is_refused_by_the_call(offline: Callable[..., Offline]) -> None:
    aws = offline()
    request = _request(MISSING_CODE_URI, fsx_file_system_id="fs-0000000000000000f")
    with pytest.raises(ClientError) as refused:
        aws.sagemaker.create_training_job(**request)
    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert "fs-0000000000000000f" in refused.value.response["Error"]["Message"]


def test_more_hosts_than_this_machine_has_cores_fail_for_capacity(
    offline: Callable[..., Offline],
) -> None:
    aws = offline(max_processes=2)
    name = aws.create(_request(MISSING_CODE_URI, instance_type="ml.m5.xlarge", instance_count=3))
    done = aws.emulator.wait(name, timeout=30)
    assert done["TrainingJobStatus"] == "Failed"
    assert done["FailureReason"].startswith("CapacityError: ")
    assert "3 hosts need 3 processes" in done["FailureReason"]


def test_smddp_fails_at_once_saying_it_cannot_run_here(offline: Callable[..., Offline]) -> None:
    aws = offline()
    request = _request(distribution="smddp", instance_type="ml.p4d.24xlarge", framework_version="2.3.0")
    name = aws.create(request)
    done = aws.emulator.wait(name, timeout=30)
    assert done["TrainingJobStatus"] == "Failed"
    assert "SMDDP" in done["FailureReason"] and "offline stack" in done["FailureReason"]
    assert aws.emulator.pids(name) == []


@pytest.mark.parametrize(
    ("instance_type", "hosts", "cores", "per_host", "note"),
    [
        ("ml.g5.2xlarge", 1, 2, 1, None),
        (
            "ml.g5.12xlarge",
            2,
            2,
            1,
            "ml.g5.12xlarge has 4 GPUs: this machine has 2 cores, so 1 process per host (2 hosts)",
        ),
        ("ml.g5.12xlarge", 1, 16, 4, None),
        ("ml.p4d.24xlarge", 1, 16, 8, None),
        (
            "ml.p5.48xlarge",
            2,
            8,
            4,
            "ml.p5.48xlarge has 8 GPUs: this machine has 8 cores, so 4 processes per host (2 hosts)",
        ),
        ("ml.g6.48xlarge", 1, 32, 8, None),
        ("ml.c5.4xlarge", 2, 8, 1, None),
        ("ml.m5.xlarge", 1, 8, 1, None),
    ],
)
def test_each_host_runs_a_process_per_gpu_capped_to_this_machine(
    instance_type: str, hosts: int, cores: int, per_host: int, note: str | None
) -> None:
    plan = plan_processes(instance_type, hosts, cores)
    assert (plan.per_host, plan.hosts, plan.note) == (per_host, hosts, note)
