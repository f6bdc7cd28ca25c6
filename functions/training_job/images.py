"""Which container images a training job runs, per region.

Two tables, both as AWS publishes them (cross-checked against the SageMaker SDK v2's
`image_uri_config/pytorch.json` and `debugger.json` by `tests/unit/training_job/test_images.py`):

- AWS's PyTorch training images (Deep Learning Containers),
  `pytorch-training:<version>-<cpu|gpu>-<py>`;
- Debugger's rule-evaluator image, `sagemaker-debugger-rules:latest`, which runs the profiler rules.

A region missing from a table is an `UnsupportedRegionError` that says what to do instead. The
ISO partitions are left out on purpose: their registries live under other DNS suffixes and this
project has no way to test them.
"""

from __future__ import annotations

from typing import Literal

from functions.training_job.errors import JobConfigurationError, UnsupportedRegionError

Processor = Literal["cpu", "gpu"]

# The DLC registry account per region; the same for every PyTorch training image since 2.0.
PYTORCH_TRAINING_ACCOUNTS: dict[str, str] = {
    "af-south-1": "626614931356",
    "ap-east-1": "871362719292",
    "ap-east-2": "975050140332",
    "ap-northeast-1": "763104351884",
    "ap-northeast-2": "763104351884",
    "ap-northeast-3": "364406365360",
    "ap-south-1": "763104351884",
    "ap-south-2": "772153158452",
    "ap-southeast-1": "763104351884",
    "ap-southeast-2": "763104351884",
    "ap-southeast-3": "907027046896",
    "ap-southeast-4": "457447274322",
    "ap-southeast-5": "550225433462",
    "ap-southeast-6": "633930458069",
    "ap-southeast-7": "590183813437",
    "ca-central-1": "763104351884",
    "ca-west-1": "204538143572",
    "cn-north-1": "727897471807",
    "cn-northwest-1": "727897471807",
    "eu-central-1": "763104351884",
    "eu-central-2": "380420809688",
    "eu-north-1": "763104351884",
    "eu-south-1": "692866216735",
    "eu-south-2": "503227376785",
    "eu-west-1": "763104351884",
    "eu-west-2": "763104351884",
    "eu-west-3": "763104351884",
    "il-central-1": "780543022126",
    "me-central-1": "914824155844",
    "me-south-1": "217643126080",
    "mx-central-1": "637423239942",
    "sa-east-1": "763104351884",
    "us-east-1": "763104351884",
    "us-east-2": "763104351884",
    "us-gov-east-1": "446045086412",
    "us-gov-west-1": "442386744353",
    "us-west-1": "763104351884",
    "us-west-2": "763104351884",
}

# The training images this project can run on, oldest first, each with the one Python version AWS
# builds it for. The trainer uses only torch APIs present since the oldest (2.3: SMDDP is in it).
PYTORCH_PY_VERSIONS: dict[str, str] = {
    "2.3.0": "py311",
    "2.4.0": "py311",
    "2.5.1": "py311",
    "2.6.0": "py312",
    "2.7.1": "py312",
    "2.8.0": "py312",
}
# A job runs the newest unless told otherwise; CI runs the trainer's tests under its torch too
# (`make test-trainer-image-torch`, whose version a unit test keeps equal to this one).
DEFAULT_FRAMEWORK_VERSION = "2.8.0"

# Debugger's rule-evaluator registry per region (aws-facts.md; the SDK's debugger.json agrees).
DEBUGGER_RULE_ACCOUNTS: dict[str, str] = {
    "af-south-1": "314341159256",
    "ap-east-1": "199566480951",
    "ap-northeast-1": "430734990657",
    "ap-northeast-2": "578805364391",
    "ap-northeast-3": "479947661362",
    "ap-south-1": "904829902805",
    "ap-southeast-1": "972752614525",
    "ap-southeast-2": "184798709955",
    "ca-central-1": "519511493484",
    "cn-north-1": "618459771430",
    "cn-northwest-1": "658757709296",
    "eu-central-1": "482524230118",
    "eu-north-1": "314864569078",
    "eu-south-1": "563282790590",
    "eu-west-1": "929884845733",
    "eu-west-2": "250201462417",
    "eu-west-3": "447278800020",
    "me-south-1": "986000313247",
    "sa-east-1": "818342061345",
    "us-east-1": "503895931360",
    "us-east-2": "915447279597",
    "us-gov-west-1": "515509971035",
    "us-west-1": "685455198987",
    "us-west-2": "895741380848",
}


def ecr_domain(region: str) -> str:
    """The DNS suffix of the region's ECR registries (the China partition has its own)."""
    return "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"


def processor_for(instance_type: str) -> Processor:
    """`gpu` for the P and G families (NVIDIA GPUs), `cpu` for everything else."""
    family = instance_type.removeprefix("ml.").split(".", 1)[0]
    return "gpu" if family[:1] in {"p", "g"} else "cpu"


def training_image_uri(region: str, framework_version: str, py_version: str, processor: Processor) -> str:
    """AWS's PyTorch training image for the region, torch version, Python version and processor."""
    account = PYTORCH_TRAINING_ACCOUNTS.get(region)
    if account is None:
        raise UnsupportedRegionError(
            f"no AWS PyTorch training image is published in region {region!r} (known: "
            f"{', '.join(sorted(PYTORCH_TRAINING_ACCOUNTS))}); set image_uri to an image you host"
        )
    expected_py = PYTORCH_PY_VERSIONS.get(framework_version)
    if expected_py is None:
        raise JobConfigurationError(
            f"framework_version {framework_version!r} is not one this project runs on (known: "
            f"{', '.join(PYTORCH_PY_VERSIONS)}); set image_uri to use another image"
        )
    if py_version != expected_py:
        raise JobConfigurationError(
            f"AWS builds the PyTorch {framework_version} training image for {expected_py} only, not {py_version}"
        )
    repository = f"{account}.dkr.ecr.{region}.{ecr_domain(region)}/pytorch-training"
    return f"{repository}:{framework_version}-{processor}-{py_version}"


def rule_evaluator_image_uri(region: str) -> str:
    """Debugger's rule-evaluator image for the region (profiler rules run in it)."""
    account = DEBUGGER_RULE_ACCOUNTS.get(region)
    if account is None:
        raise UnsupportedRegionError(
            f"SageMaker Debugger's rule evaluator is not available in region {region!r}, so "
            "profiling 'debugger' cannot run there: use profiling 'builtin'"
        )
    return f"{account}.dkr.ecr.{region}.{ecr_domain(region)}/sagemaker-debugger-rules:latest"


def inference_image_uri(region: str, framework_version: str, py_version: str, processor: Processor) -> str:
    """AWS's PyTorch inference image matching a training image: what a registered model names.

    AWS publishes `pytorch-inference` from the same registry account as `pytorch-training`.
    """
    training = training_image_uri(region, framework_version, py_version, processor)
    return training.replace("/pytorch-training:", "/pytorch-inference:")
