"""`JobConfig`: what an engineer chooses about a training job, validated, with documented defaults.

Read by `load_job_config` from, in rising precedence: the defaults below, a JSON or YAML file,
`TRAINING_JOB_<FIELD>` environment variables (lists, maps and numbers as JSON, e.g.
`TRAINING_JOB_SUBNETS='["subnet-0abc"]'`), and explicit overrides (the CLI's flags). The region
falls back to `AWS_REGION`, then `AWS_DEFAULT_REGION` (a Lambda always has the first), then for
`retrain plan-job` the AWS profile's (boto3's resolution, ~/.aws/config included).

Checks on single fields live here; combinations SageMaker refuses live in `refusals.py`.
"""

from __future__ import annotations

import json
import os
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from functions.common.debugger import PROFILER_REPORT, PROFILER_RULE_DEFAULTS, ProfilerRuleName
from functions.training_job.errors import JobConfigFileError, JobConfigurationError
from functions.training_job.images import DEFAULT_FRAMEWORK_VERSION, PYTORCH_PY_VERSIONS

ENV_PREFIX = "TRAINING_JOB_"

S3Uri = Annotated[str, StringConstraints(pattern=r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?$")]
Region = Annotated[str, StringConstraints(pattern=r"^[a-z]{2}(-[a-z]+)+-\d$")]
KmsKey = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9:/_-]{1,2048}$")]

# CreateTrainingJob limits (botocore's model, checked on AWS's side).
MAX_RUNTIME_SECONDS = 28 * 24 * 3600
MAX_RULES = 20
MAX_HYPERPARAMETER_VALUE = 2500

# Set by the builder from the run, never by configuration: the container's own `sagemaker_*`
# parameters, and the trainer flags that say what to train on and how to launch.
RESERVED_HYPERPARAMETERS = ("dataset-version", "backend")

DEFAULT_RULES: tuple[ProfilerRuleName, ...] = (
    "ProfilerReport",
    "LowGPUUtilization",
    "CPUBottleneck",
    "IOBottleneck",
    "StepOutlier",
)
HyperparameterValue = str | bool | int | float


class ProfilerRuleSpec(BaseModel):
    """One Debugger profiler rule to run (`debugger` back end only).

    In a file, a bare rule name (`LowGPUUtilization`) stands for the rule with its defaults.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rule: ProfilerRuleName
    # RuleConfigurationName; defaults to the rule's name. Give one to run a rule twice.
    name: str | None = Field(default=None, min_length=1, max_length=256)
    # Overrides of the rule's defaults. ProfilerReport takes `<Rule>_<parameter>` names.
    parameters: dict[str, str | int | float] = Field(default_factory=dict)

    @property
    def configuration_name(self) -> str:
        return self.name or self.rule

    @field_validator("parameters")
    @classmethod
    def _known_parameters(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        rule = info.data.get("rule")
        if rule is None:
            return value
        if rule == PROFILER_REPORT:
            known = {f"{sub}_{name}" for sub, defaults in PROFILER_RULE_DEFAULTS.items() for name in defaults}
        else:
            known = set(PROFILER_RULE_DEFAULTS[rule])
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"{rule} has no parameter {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        return value


class JobConfig(BaseModel):
    """Every choice about a training job; the defaults are what a run gets unless told otherwise."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # --- where, as whom, how named ---
    region: Region
    role_arn: str = Field(pattern=r"^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$")
    # Job names are <prefix>-<dataset version>-<hash>; short, so the version keeps its room.
    job_name_prefix: str = Field(default="retrain", pattern=r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,19}$")
    tags: dict[str, str] = Field(default_factory=dict)

    # --- the container: AWS's PyTorch training image unless image_uri names another ---
    image_uri: str | None = Field(default=None, min_length=1, max_length=255)
    framework_version: str = DEFAULT_FRAMEWORK_VERSION
    # AWS builds each image for one Python: when only the framework version is given, its Python.
    py_version: str = PYTORCH_PY_VERSIONS[DEFAULT_FRAMEWORK_VERSION]
    # The sourcedir.tar.gz holding trainer/ (the run may name another) and its entry point.
    code_s3_uri: S3Uri | None = None
    entry_point: str = "train.py"
    container_log_level: int = 20  # logging.INFO, as the SDK sends it
    # Trainer flags without the dashes (`epochs`, `batch-size`), JSON-encoded like the SDK does.
    hyperparameters: dict[str, HyperparameterValue] = Field(default_factory=dict)
    environment: dict[str, str] = Field(default_factory=dict)

    # --- compute ---
    instance_type: str = Field(default="ml.g5.2xlarge", pattern=r"^ml\.[a-z0-9-]+\.[a-z0-9]+$")
    instance_count: int = Field(default=1, ge=1)
    volume_size_gb: int = Field(default=50, ge=1, le=16384)
    volume_kms_key_id: KmsKey | None = None
    max_runtime_seconds: int = Field(default=86400, ge=1, le=MAX_RUNTIME_SECONDS)
    use_spot: bool = False
    # Spot only: runtime plus time spent waiting for capacity; at least max_runtime_seconds.
    max_wait_seconds: int | None = Field(default=None, ge=1)
    # Encrypts traffic between instances (costs some speed on multi-instance jobs).
    encrypt_inter_container_traffic: bool = True

    # --- data: the curated zone, on FSx for Lustre (reached through the VPC) or read from S3 ---
    # fsx: a file system linked to dataset/ (fast on every epoch, but it costs while idle);
    # s3: the `train` channel streams s3://<bucket>/dataset/ in FastFile mode (no standing cost;
    # each epoch reads from S3, so many small files train slower).
    dataset_source: Literal["fsx", "s3"] = "fsx"
    fsx_file_system_id: str | None = Field(default=None, pattern=r"^fs-[0-9a-f]{8,}$")
    fsx_mount_name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_]{1,32}$")
    # The file-system path the data repository association links to `dataset/`.
    fsx_directory: str = Field(default="dataset", pattern=r"^[A-Za-z0-9._\-]+(/[A-Za-z0-9._\-]+)*$")
    # dataset_source s3: the curated zone's prefix (images/, labels/, manifests/ below it).
    dataset_s3_uri: S3Uri | None = None
    subnets: list[str] = Field(default_factory=list, max_length=16)
    security_group_ids: list[str] = Field(default_factory=list, max_length=5)
    # EnableNetworkIsolation: the training code reaches no network but the job's other instances
    # and has no AWS credentials; SageMaker itself reads every channel (the code comes as one) and
    # writes the output. The deployed role may create no other job (sagemaker:NetworkIsolation).
    network_isolation: bool = True
    # The accepted model (a folder holding model.pt): channel `model`, SM_CHANNEL_MODEL.
    model_s3_uri: S3Uri | None = None

    # --- outputs ---
    output_s3_uri: S3Uri
    output_kms_key_id: KmsKey | None = None
    # SageMaker syncs /opt/ml/checkpoints to <checkpoint_s3_uri or output_s3_uri/checkpoints>/<job>.
    checkpointing: bool = True
    checkpoint_s3_uri: S3Uri | None = None

    # --- distribution and profiling ---
    # torch: torchrun (NCCL on GPUs); smddp: SageMaker's data-parallel library, P4d/P4de only.
    distribution: Literal["torch", "smddp"] = "torch"
    # builtin: the trainer profiles itself; debugger: SageMaker Debugger's rules (closed to new
    # AWS customers since 2026-07-30).
    profiling: Literal["builtin", "debugger"] = "builtin"
    profiling_interval_ms: Literal[100, 200, 500, 1000, 5000, 60000] = 500
    rules: list[ProfilerRuleSpec] = Field(
        default_factory=lambda: [ProfilerRuleSpec(rule=rule) for rule in DEFAULT_RULES]
    )

    @model_validator(mode="before")
    @classmethod
    def _python_of_the_image(cls, values: Any) -> Any:
        if isinstance(values, dict) and values.get("py_version") is None:
            python = PYTORCH_PY_VERSIONS.get(values.get("framework_version", DEFAULT_FRAMEWORK_VERSION))
            if python is not None:
                return {**values, "py_version": python}
        return values

    @field_validator("rules", mode="before")
    @classmethod
    def _bare_rule_names(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"rule": item} if isinstance(item, str) else item for item in value]
        return value

    @field_validator("rules")
    @classmethod
    def _distinct_rule_names(cls, value: list[ProfilerRuleSpec]) -> list[ProfilerRuleSpec]:
        names = [rule.configuration_name for rule in value]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(
                f"rule configuration names must differ; {', '.join(repeated)} appears twice (give one a `name`)"
            )
        return value

    @field_validator("hyperparameters")
    @classmethod
    def _hyperparameters_we_may_send(cls, value: dict[str, HyperparameterValue]) -> dict[str, HyperparameterValue]:
        problems: list[str] = []
        for key, item in value.items():
            if key.startswith("sagemaker_"):
                problems.append(f"{key!r} is reserved for the SageMaker container")
            elif key in RESERVED_HYPERPARAMETERS:
                problems.append(f"{key!r} is set from the run, not from configuration")
            elif key.startswith("-") or not 1 <= len(key) <= 256:
                problems.append(f"{key!r} must be a flag name without dashes, at most 256 long")
            encoded = encode_hyperparameter(item)
            if len(encoded) > MAX_HYPERPARAMETER_VALUE:
                problems.append(
                    f"{key!r} is {len(encoded)} characters once encoded, SageMaker takes at most "
                    f"{MAX_HYPERPARAMETER_VALUE}"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @property
    def checkpoint_base_uri(self) -> str:
        return (self.checkpoint_s3_uri or f"{self.output_s3_uri.rstrip('/')}/checkpoints").rstrip("/")


def encode_hyperparameter(value: HyperparameterValue) -> str:
    """The SDK v2 JSON-encodes every hyperparameter value (`"a"` -> `"\\"a\\""`, True ->
    `"true"`); the PyTorch container decodes them again before passing `--name value`."""
    return json.dumps(value)


def load_job_config(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    default_region: Callable[[], str | None] | None = None,
) -> JobConfig:
    """The job configuration from a file, the environment and overrides, validated.

    `default_region` is asked for a region when none of those, AWS_REGION nor AWS_DEFAULT_REGION
    names one (the CLI asks boto3, which reads the AWS profile's config file).

    Raises `JobConfigFileError` when the file cannot be read, `JobConfigurationError` (one reason
    per problem) when the values are invalid.
    """
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = read_config_file(path) if path is not None else {}
    values.update(environment_values(environ))
    values.update({name: value for name, value in (overrides or {}).items() if value is not None})
    if "region" not in values:
        region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
        if not region and default_region is not None:
            region = default_region()
        if region:
            values["region"] = region
    return parse_job_config(values)


def parse_job_config(values: Mapping[str, Any]) -> JobConfig:
    try:
        return JobConfig.model_validate(values)
    except ValidationError as exc:
        raise JobConfigurationError([_describe(error) for error in exc.errors(include_url=False)]) from exc


def read_config_file(path: Path) -> dict[str, Any]:
    """A JSON (`.json`) or YAML (anything else) mapping."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise JobConfigFileError(f"cannot read the job configuration {path}: {exc}") from exc
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise JobConfigFileError(f"{path} is not valid JSON: {exc}") from exc
    else:
        # Imported here: the Lambda package has no YAML parser (it reads JSON or the environment).
        import yaml  # noqa: PLC0415

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise JobConfigFileError(f"{path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise JobConfigFileError(f"{path} must hold a mapping of settings, not {type(data).__name__}")
    return data


def environment_values(environ: Mapping[str, str]) -> dict[str, Any]:
    """`TRAINING_JOB_<FIELD>` variables; text fields as given, every other field as JSON."""
    values: dict[str, Any] = {}
    for name, field in JobConfig.model_fields.items():
        raw = environ.get(f"{ENV_PREFIX}{name.upper()}")
        if raw is None:
            continue
        if _is_text(field.annotation):
            values[name] = raw
            continue
        try:
            values[name] = json.loads(raw)
        except ValueError:
            values[name] = raw  # a bare word for a Literal, say; validation names any mistake
    return values


def _is_text(annotation: Any) -> bool:
    """`str`, a constrained `str`, or either of them or None."""
    if annotation is str:
        return True
    if get_origin(annotation) is Annotated:
        return _is_text(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return all(arg is type(None) or _is_text(arg) for arg in get_args(annotation))
    return False


def _describe(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "config"
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "missing" and len(error["loc"]) == 1:
        name = str(error["loc"][0])
        also = " or AWS_REGION" if name == "region" else ""
        return f"{where}: required (in the file, or as {ENV_PREFIX}{name.upper()}{also})"
    if error["type"] in {"missing", "extra_forbidden"}:
        return f"{where}: {message}"
    shown = repr(error["input"])
    shown = shown if len(shown) <= 80 else f"{shown[:77]}..."
    return f"{where}: {message} (got {shown})"
