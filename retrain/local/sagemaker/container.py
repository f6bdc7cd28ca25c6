"""The SageMaker training container's contract, played on this machine.

Each emulated host (`algo-1`..`algo-N`) gets a folder laid out like `/opt/ml`: the configuration
files SageMaker writes (`input/config/hyperparameters.json`, `resourceconfig.json`,
`inputdataconfig.json`), the channels, `model/`, `output/data/`, `output/failure`, `checkpoints/`
and `code/`. The PyTorch container's launcher is played too: hyperparameters JSON-decoded, the
`sagemaker_*` ones kept from the script, the rest passed as `--name value` in name order; `SM_*`
variables; torchrun with one process per GPU of the instance type (capped to this machine).
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from functions.training_job.images import processor_for
from functions.training_job.refusals import gpus_per_instance
from retrain.local.sagemaker.state import MAX_REASON

# Where a SageMaker container finds its input channels, one folder each.
CHANNELS_IN_CONTAINER = "/opt/ml/input/data/"
# What an isolated container does not get (EnableNetworkIsolation: "no AWS credentials are made
# available to the container"): credentials, and the endpoint that would reach the offline stack.
_AWS_ACCESS_VARIABLES = (
    "AWS_ACCESS_KEY",
    "AWS_SECRET",
    "AWS_SESSION",
    "AWS_SECURITY",
    "AWS_PROFILE",
    "AWS_ENDPOINT",
    "AWS_SHARED_CREDENTIALS",
    "AWS_CONFIG_FILE",
    "AWS_CONTAINER",
    "AWS_WEB_IDENTITY",
    "AWS_ROLE",
)


def isolated(environment: Mapping[str, str]) -> dict[str, str]:
    """The environment without AWS credentials or endpoints, as an isolated container has it."""
    return {name: value for name, value in environment.items() if not name.startswith(_AWS_ACCESS_VARIABLES)}


# What a launcher running inside this process would otherwise leak into a job.
_LAUNCHER_VARIABLES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "ROLE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
    }
)
# torchrun's own log records and its failure report (not the trainer's words).
_AGENT_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S*torch/distributed/")
# The record torchrun writes when a worker fails: what follows is its own report, not a cause.
_AGENT_FAILED = ("] failed (exitcode: ", "ChildFailedError")
STDERR_TAIL_LINES = 30


@dataclass(frozen=True)
class HostLayout:
    """One emulated host's `/opt/ml`: `workdir/<job>/<host>/`."""

    root: Path
    name: str

    @property
    def config_dir(self) -> Path:
        return self.root / "input" / "config"

    def channel(self, name: str) -> Path:
        return self.root / "input" / "data" / name

    def in_container(self, path: str) -> Path:
        """Where a path of the container's `/opt/ml/input/data/...` is on this host."""
        return self.root / "input" / "data" / path.removeprefix(CHANNELS_IN_CONTAINER)

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def output(self) -> Path:
        return self.root / "output"

    @property
    def output_data(self) -> Path:
        return self.root / "output" / "data"

    @property
    def failure(self) -> Path:
        return self.root / "output" / "failure"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def code(self) -> Path:
        return self.root / "code"

    @property
    def logs(self) -> Path:
        return self.root / "logs.txt"

    @property
    def debugger(self) -> Path:
        """Debugger's system monitor writes here: outside output/data, as on AWS."""
        return self.root / "debugger"

    def create(self) -> None:
        for folder in (self.config_dir, self.model, self.output_data, self.checkpoints, self.code):
            folder.mkdir(parents=True, exist_ok=True)


def host_names(count: int) -> list[str]:
    return [f"algo-{index}" for index in range(1, count + 1)]


# --------------------------------------------------------------- hyperparameters --
def decode_hyperparameters(raw: Mapping[str, str]) -> dict[str, Any]:
    """As the container decodes them: JSON where a value is JSON, the text itself otherwise."""
    decoded: dict[str, Any] = {}
    for name, value in raw.items():
        try:
            decoded[name] = json.loads(value)
        except ValueError:
            decoded[name] = value
    return decoded


def script_hyperparameters(decoded: Mapping[str, Any]) -> dict[str, Any]:
    """What the script gets: everything but the container's own `sagemaker_*` parameters."""
    return {name: value for name, value in decoded.items() if not name.startswith("sagemaker_")}


def _argument(value: Any) -> str:
    # sagemaker-training's mapping: str() of the decoded value (True -> "True").
    if isinstance(value, Mapping):
        return ",".join(f"{key}={item}" for key, item in value.items())
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def script_arguments(hyperparameters: Mapping[str, Any], checkpoint_dir: Path) -> list[str]:
    """`--name value` for every script hyperparameter, in name order, then `--checkpoint-dir`.

    Deviation: the trainer's default checkpoint folder is /opt/ml/checkpoints, which cannot be
    written here, so every job is given its host's `checkpoints/` (a `checkpoint-dir`
    hyperparameter, which would name a path inside the container, is replaced).
    """
    arguments: list[str] = []
    for name in sorted(hyperparameters):
        if name == "checkpoint-dir":
            continue
        arguments += [f"--{name}", _argument(hyperparameters[name])]
    return [*arguments, "--checkpoint-dir", str(checkpoint_dir)]


# ------------------------------------------------------------------ processes --
@dataclass(frozen=True)
class ProcessPlan:
    """How many processes each host runs, and why, when fewer than SageMaker would."""

    per_host: int
    hosts: int
    note: str | None = None

    @property
    def total(self) -> int:
        return self.per_host * self.hosts


def _plural(count: int, word: str, plural: str | None = None) -> str:
    return f"{count} {word if count == 1 else plural or word + 's'}"


def plan_processes(instance_type: str, hosts: int, max_processes: int) -> ProcessPlan:
    """SageMaker's processes per host (one per GPU, one on a CPU type), capped so that all hosts
    together run at most `max_processes` (at least one each)."""
    gpus = gpus_per_instance(instance_type)
    wanted = gpus or 1
    fair_share = max(1, max_processes // hosts)
    per_host = min(wanted, fair_share)
    host_words = _plural(hosts, "host")
    process_words = f"{_plural(per_host, 'process', 'processes')} per host"
    if gpus is None and processor_for(instance_type) == "gpu":
        note = f"the GPUs of {instance_type} are not known here, so {process_words} ({host_words})"
        return ProcessPlan(per_host, hosts, note)
    if per_host < wanted:
        note = (
            f"{instance_type} has {_plural(wanted, 'GPU')}: this machine has "
            f"{_plural(max_processes, 'core')}, so {process_words} ({host_words})"
        )
        return ProcessPlan(per_host, hosts, note)
    return ProcessPlan(per_host, hosts)


def free_port() -> int:
    """A loopback port nobody listens on now (the job's torchrun master port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def launch_command(
    python: str,
    script: Path,
    arguments: list[str],
    *,
    torchrun: bool,
    plan: ProcessPlan,
    node_rank: int,
    master_port: int,
) -> list[str]:
    """torchrun on every host (`sagemaker_torch_distributed_enabled`), else the bare script."""
    if not torchrun:
        return [python, str(script), *arguments]
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(plan.hosts),
        "--node-rank",
        str(node_rank),
        "--nproc-per-node",
        str(plan.per_host),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(master_port),
        str(script),
        *arguments,
    ]


# ------------------------------------------------------------- configuration --
def write_configuration(
    host: HostLayout,
    hosts: list[str],
    request: Mapping[str, Any],
) -> None:
    """The files SageMaker writes into `/opt/ml/input/config/` before the container starts."""
    instance_type = request["ResourceConfig"]["InstanceType"]
    resource = {
        "current_host": host.name,
        "current_instance_type": instance_type,
        "current_group_name": "homogeneousCluster",
        "hosts": hosts,
        "instance_groups": [
            {
                "instance_group_name": "homogeneousCluster",
                "instance_type": instance_type,
                "hosts": hosts,
            }
        ],
        "network_interface_name": "lo",
    }
    channels = {
        channel["ChannelName"]: {
            "TrainingInputMode": channel.get(
                "InputMode", request["AlgorithmSpecification"].get("TrainingInputMode", "File")
            ),
            "S3DistributionType": channel["DataSource"]
            .get("S3DataSource", {})
            .get("S3DataDistributionType", "FullyReplicated"),
            "RecordWrapperType": channel.get("RecordWrapperType", "None"),
        }
        for channel in request.get("InputDataConfig", [])
    }
    files = {
        # As given: string values, still JSON-encoded.
        "hyperparameters.json": dict(request.get("HyperParameters", {})),
        "resourceconfig.json": resource,
        "inputdataconfig.json": channels,
    }
    for name, document in files.items():
        (host.config_dir / name).write_text(json.dumps(document, indent=2), encoding="utf-8")


def container_environment(
    base: Mapping[str, str],
    request: Mapping[str, Any],
    *,
    host: HostLayout,
    hosts: list[str],
    channels: Mapping[str, Path],
    hyperparameters: Mapping[str, Any],
    cpus: int,
) -> dict[str, str]:
    """os.environ + the request's Environment + the container's `SM_*` + OMP_NUM_THREADS=1."""
    env = {
        name: value
        for name, value in base.items()
        if not name.startswith(("SM_", "TORCHELASTIC_")) and name not in _LAUNCHER_VARIABLES
    }
    env.update(request.get("Environment", {}))
    job_name = request["TrainingJobName"]
    channel_dirs = {name: str(path) for name, path in channels.items()}
    training_env = {
        "job_name": job_name,
        "current_host": host.name,
        "hosts": hosts,
        "master_hostname": hosts[0],
        "is_master": host.name == hosts[0],
        "current_instance_type": request["ResourceConfig"]["InstanceType"],
        "hyperparameters": dict(hyperparameters),
        "channel_input_dirs": channel_dirs,
        "input_dir": str(host.root / "input"),
        "input_config_dir": str(host.config_dir),
        "input_data_config": json.loads((host.config_dir / "inputdataconfig.json").read_text(encoding="utf-8")),
        "model_dir": str(host.model),
        "output_dir": str(host.output),
        "output_data_dir": str(host.output_data),
        "module_dir": str(host.code),
        "num_gpus": 0,
        "num_cpus": cpus,
        "network_interface_name": "lo",
    }
    env.update({f"SM_CHANNEL_{name.upper()}": path for name, path in channel_dirs.items()})
    env.update(
        {
            "SM_CHANNELS": json.dumps(sorted(channel_dirs)),
            "SM_MODEL_DIR": str(host.model),
            "SM_OUTPUT_DATA_DIR": str(host.output_data),
            "SM_OUTPUT_DIR": str(host.output),
            "SM_INPUT_DIR": str(host.root / "input"),
            "SM_INPUT_CONFIG_DIR": str(host.config_dir),
            "SM_MODULE_DIR": str(host.code),
            "SM_CURRENT_HOST": host.name,
            "SM_HOSTS": json.dumps(hosts),
            "SM_CURRENT_INSTANCE_TYPE": request["ResourceConfig"]["InstanceType"],
            "SM_NETWORK_INTERFACE_NAME": "lo",
            # The trainer's processes run on this machine's CPUs, whatever the instance type has.
            "SM_NUM_GPUS": "0",
            "SM_NUM_CPUS": str(cpus),
            "SM_HPS": json.dumps(dict(hyperparameters)),
            "SM_TRAINING_ENV": json.dumps(training_env),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
        }
    )
    return env


# -------------------------------------------------------------------- results --
def failure_reason(exit_code: int, stderr_tail: Iterable[str], failure_file: Path) -> str:
    """SageMaker's "AlgorithmError: ..." for a host that exited non-zero: the trainer's own
    `output/failure` when it wrote one, else the last lines it wrote to stderr (torchrun's own
    report about the failed worker left out: it names no cause)."""
    try:
        written = failure_file.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        written = ""
    if written:
        return f"AlgorithmError: {written}"
    lines: list[str] = []
    for line in stderr_tail:
        if any(marker in line for marker in _AGENT_FAILED):
            break
        if not _AGENT_LINE.match(line):
            lines.append(line)
    message = "\n".join(lines[-STDERR_TAIL_LINES:]).strip() or "(nothing on stderr)"
    head = f'AlgorithmError: ExecuteUserScriptError:\nExitCode {exit_code}\nErrorMessage "'
    # The model's 1024 characters: the message loses its oldest lines, never the wrapper.
    room = MAX_REASON - len(head) - 1
    if len(message) > room:
        message = "..." + message[-(room - 3) :]
    return f'{head}{message}"'


def cpus_per_host(hosts: int) -> int:
    return max(1, (os.cpu_count() or 1) // hosts)
