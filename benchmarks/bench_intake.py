"""Intake at scale: Lambda invocations per upload, runs per drop, cold start, package size.

    .venv/bin/python benchmarks/bench_intake.py [--objects 1000] [--drops 3] [--repeats 5]
        [--full-size-pairs 20] [--full-size-only]

Run from the repository root. Prints `name: value` lines on stdout, progress on stderr:
- `intake_objects_per_second_offline`: the burst below, from its first upload until the queue is
  empty (every object taken; 96x48 scenes, the template's batch size and window, one poller, moto
  in this process): objects over seconds.
- `lambda_invocations_per_1000_objects`: an annotation team's burst of uploads (distinct small
  street scenes, image + label) through S3 -> SQS -> the offline stack's real event-source
  poller with the template's BatchSize and MaximumBatchingWindowInSeconds -> the intake
  function; invocations of the intake function, scaled to 1,000 objects.
- `executions_per_data_drop`: drops one after another, each closed by its `_COMPLETE` marker
  (MinNewPairs=1, SettleSeconds=0), every schedule fired twice more after each run; Step
  Functions executions over drops (target: exactly 1).
- `intake_seconds_per_object_2048x1024`: `--full-size-pairs` street scenes at 2048x1024 (JPEG
  quality 90 and PNG mask, bench_validation.py's generator) through the real handler on the
  offline stack, delivered in one SQS batch: the intake function's wall time per object.
  `intake_full_batch_seconds` extrapolates it to the template's BatchSize, and
  `intake_batch_time_fraction` divides that by the intake function's Timeout (the infrastructure
  issue wants at most 0.5). S3 and DynamoDB are moto in the same process, so their latency is
  not AWS's. `intake_batch_time_fraction_at_lambda_cpu` scales the fraction to the vCPU share
  Lambda gives the function's MemorySize (1,769 MB buy one vCPU), as if all of it were CPU work
  on a core as fast as this one: an upper estimate.
- `intake_cold_start_import_seconds`, `boto3_import_seconds`, `intake_import_vs_boto3_ratio`:
  `import functions.intake.app` in a fresh interpreter with the function's environment, as on
  Lambda (tracing on), against a bare `import boto3`; medians over `--repeats`, after one
  discarded import that writes the bytecode caches (a deployed package ships compiled files).
- `deployed_package_mib`: what the Makefile's `build-%` target (SAM's makefile builder) puts in
  the artifact, built by `make build-IntakeFunction ARTIFACTS_DIR=<a temporary folder>`:
  `functions/` (without caches) plus the Lambda platform's wheels (python3.13, aarch64) of the
  packages that target names, with `constraints.txt`. Fails if torch or the SageMaker SDK ends up
  inside. Where the build fails (no network, say), the installed distributions of that dependency
  closure are measured instead (`deployed_package_method` says which).
- `intake_package_mb`: the intake function's package, MiB (as Lambda's 250 MB quota counts):
  `.aws-sam/build/IntakeFunction` where `make sam-build` left one newer than the Makefile and
  constraints.txt, else the package built above (`intake_package_source` says which).

    .venv/bin/python benchmarks/bench_intake.py --package-only   # only the package figures
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import os
import random
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

from bench_validation import SIZE as FULL_SIZE
from bench_validation import street_pair
from packaging.requirements import Requirement
from PIL import Image

from functions.common.contracts import split_for
from functions.trigger.logic import TriggerPolicy
from retrain.local.cloudformation.stack import DEFAULT_TEMPLATE, OfflineStack, StackOptions
from retrain.local.cloudformation.template import load_template
from retrain.synth import draw_scene

ROOT = Path(__file__).resolve().parents[1]
SCENE_SIZE = (96, 48)
MIB = 1024 * 1024
# Functions log JSON at INFO on AWS; here only the numbers should reach stdout.
VAL_FRACTION = TriggerPolicy.val_fraction
QUIET = {"POWERTOOLS_LOG_LEVEL": "WARNING", "POWERTOOLS_METRICS_DISABLED": "true"}
FORBIDDEN = ("torch", "sagemaker")
INTAKE = "IntakeFunction"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def metric(name: str, value: object) -> None:
    print(f"{name}: {value}", flush=True)


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Whatever the stack and its functions print goes to stderr, not between the numbers."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


# ------------------------------------------------------------------ uploads --
def encode(picture: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    picture.save(buffer, format=fmt)
    return buffer.getvalue()


def scenes(count: int, seed: int) -> Iterator[tuple[bytes, bytes]]:
    """`count` distinct image/label pairs: one drawn scene, each image given its own JPEG
    comment (same pixels, different bytes: no pair is a duplicate of another)."""
    image, label = draw_scene(SCENE_SIZE, random.Random(seed))
    jpeg, png = encode(image, "JPEG"), encode(label, "PNG")
    for index in range(count):
        comment = b"\xff\xfe\x00\x06" + seed.to_bytes(1, "big") + index.to_bytes(3, "big")
        yield jpeg[:2] + comment + jpeg[2:], png


def put(stack: OfflineStack, key: str, body: bytes) -> None:
    stack.aws.s3.put_object(Bucket=stack.ref("DataBucket"), Key=key, Body=body)


def queue_depth(stack: OfflineStack) -> int:
    attributes = stack.aws.sqs.get_queue_attributes(
        QueueUrl=stack.ref("IntakeQueue"),
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return sum(int(value) for value in attributes.values())


def wait_for(condition: Callable[[], bool], timeout: float, what: str, every: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_intake: timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def wait_for_finished(runs: Callable[[], list[dict[str, object]]], count: int, what: str) -> None:
    wait_for(lambda: sum(r["status"] != "RUNNING" for r in runs()) >= count, 60, what)


def intake_invocations(stack: OfflineStack) -> int:
    return sum(INTAKE in i.function for i in stack.runtime.invocations)


# ------------------------------------------------- invocations per objects --
def invocations_per_thousand(objects: int) -> tuple[float, float, int, float, float]:
    """(invocations per 1,000 objects, mean objects per invocation, batch size, window, objects
    per second from the first upload to the last object taken)."""
    # The template's batching window and batch size: no override.
    options = StackOptions(tick=False, function_environment=QUIET)
    with quiet_stdout(), OfflineStack(options) as stack:
        (mapping,) = stack.poller.mappings
        log(
            f"[invocations] batch size {mapping.batch_size}, window "
            f"{mapping.batching_window_seconds:g} s; uploading {objects} objects"
        )
        # S3 announces a new notification configuration with an s3:TestEvent: not an upload.
        wait_for(lambda: queue_depth(stack) == 0, 60, "the s3:TestEvent to be consumed")
        before = intake_invocations(stack)
        started = time.monotonic()
        for index, (image, label) in enumerate(scenes(objects // 2, seed=1)):
            put(stack, f"incoming/burst/images/{index:05d}.jpg", image)
            put(stack, f"incoming/burst/labels/{index:05d}.png", label)
        uploaded = time.monotonic() - started
        log(f"[invocations] uploaded in {uploaded:.1f} s; waiting for the intake")
        # Every half second: each look counts the queue's messages, in the same process as the
        # intake (a look every 0.1 s took a fifth of the run's time at 1,000 objects).
        wait_for(lambda: queue_depth(stack) == 0, 600, "the intake to take every upload", every=0.5)
        invocations = intake_invocations(stack) - before
        failed = [i for i in stack.runtime.invocations[before:] if INTAKE in i.function and i.failed]
        if failed:
            raise SystemExit(f"bench_intake: {len(failed)} intake invocations failed: {failed[0]}")
        elapsed = time.monotonic() - started
        log(f"[invocations] {invocations} invocations in {elapsed:.1f} s for {objects} objects")
        return (
            invocations * 1000 / objects,
            objects / invocations,
            mapping.batch_size,
            mapping.batching_window_seconds,
            objects / elapsed,
        )


# --------------------------------------------------------- runs per drop --
# A run that takes seconds: this measures how many runs a drop starts, not training.
QUICK_RUN = {
    "TrainingInstanceType": "ml.m5.xlarge",
    "TrainingInstanceCount": "1",
    "TrainingEpochs": "1",
    "TrainingWidth": "0.25",
    "TrainingBatchSize": "2",
    "TrainingExtraHyperparameters": '{"workers": 0}',
    "PollSeconds": "1",
    "PollMaxSeconds": "1",
}


def drop_scenes(pairs: int, seed: int) -> list[tuple[bytes, bytes]]:
    """`pairs` scenes, one of them in the validation split: the trigger starts no run without one
    (its default val_fraction, 0.1), which a drop of a few pairs would otherwise often lack."""

    def in_val(image: bytes) -> bool:
        return split_for(hashlib.sha256(image).hexdigest(), VAL_FRACTION) == "val"

    drawn = scenes(10_000, seed)
    chosen = [next(drawn) for _ in range(pairs - 1)]
    wanted = (lambda _: True) if any(in_val(image) for image, _ in chosen) else in_val
    chosen.append(next(pair for pair in drawn if wanted(pair[0])))
    return chosen


def executions_per_drop(drops: int, pairs: int) -> float:
    parameters = {"MinNewPairs": "1", "SettleSeconds": "0", **QUICK_RUN}
    options = StackOptions(
        parameters=parameters,
        poll=False,
        tick=False,
        batching_window_seconds=0,
        function_environment=QUIET,
    )
    with quiet_stdout(), OfflineStack(options) as stack:
        (mapping,) = stack.poller.mappings
        sfn = stack.aws.stepfunctions
        machine = stack.ref("RetrainStateMachine")

        def runs() -> list[dict[str, object]]:
            return [dict(e) for e in sfn.list_executions(stateMachineArn=machine)["executions"]]

        def deliver() -> None:
            while stack.poller.poll_once(mapping, wait_seconds=0.1).received:
                pass

        for drop in range(drops):
            batch = f"drop-{drop}"
            for index, (image, label) in enumerate(drop_scenes(pairs, seed=10 + drop)):
                put(stack, f"incoming/{batch}/images/{index:03d}.jpg", image)
                put(stack, f"incoming/{batch}/labels/{index:03d}.png", label)
            put(stack, f"incoming/{batch}/_COMPLETE", b"")
            deliver()
            wait_for_finished(runs, drop + 1, f"the run of {batch}")
            # The schedules keep firing (sweeper, trigger): none of that may start a second run.
            for _ in range(2):
                stack.ticker.tick_all()
            deliver()
            log(f"[drops] {batch}: {len(runs())} executions so far")
        not_succeeded = [r for r in runs() if r["status"] != "SUCCEEDED"]
        if not_succeeded:
            raise SystemExit(f"bench_intake: runs did not succeed: {not_succeeded}")
        return len(runs()) / drops


# ------------------------------------------------------ full-size objects --
LAMBDA_MB_PER_VCPU = 1769  # Lambda's documented memory size that comes with one full vCPU


def template_intake_settings() -> tuple[int, int, int]:
    """(BatchSize, Timeout in seconds, MemorySize in MB) of the intake function, from template.yaml."""
    template = load_template(DEFAULT_TEMPLATE)
    props = template.resources[INTAKE]["Properties"]
    (event,) = props["Events"].values()

    def resolved(name: str) -> int:
        value = props.get(name, template.function_globals.get(name))
        if isinstance(value, dict) and "Ref" in value:
            value = template.parameters[value["Ref"]]["Default"]
        return int(value)

    return int(event["Properties"]["BatchSize"]), resolved("Timeout"), resolved("MemorySize")


def full_size_seconds_per_object(pairs: int) -> float:
    """Wall seconds of the intake function per object, for 2048x1024 pairs in one SQS batch."""
    log(f"[full size] drawing {pairs} pairs of {FULL_SIZE[0]}x{FULL_SIZE[1]}")
    drawn = [street_pair(seed) for seed in range(pairs)]
    # The emulator discards an invocation that outlives its timeout: measure here without one (the
    # template's timeout is what the time is compared with).
    unlimited = {"FunctionTimeoutSeconds": "900", "IntakeVisibilityTimeoutSeconds": "5400"}
    options = StackOptions(
        parameters=unlimited, poll=False, tick=False, batching_window_seconds=0, function_environment=QUIET
    )
    with quiet_stdout(), OfflineStack(options) as stack:
        (mapping,) = stack.poller.mappings
        # S3 announces a new notification configuration with an s3:TestEvent: not an upload.
        while stack.poller.poll_once(mapping, wait_seconds=0.5).received:
            pass
        before = len(stack.runtime.invocations)
        for index, (image, label) in enumerate(drawn):
            put(stack, f"incoming/full-size/images/{index:04d}.jpg", image)
            put(stack, f"incoming/full-size/labels/{index:04d}.png", label)
        received = 0
        while delivered := stack.poller.poll_once(mapping, wait_seconds=0.5).received:
            received += delivered
        invocations = [i for i in stack.runtime.invocations[before:] if INTAKE in i.function]
        failed = [i for i in invocations if i.failed]
        if failed or received != 2 * pairs:
            raise SystemExit(f"bench_intake: {received} of {2 * pairs} delivered, failed: {failed[:1]}")
        pages = stack.aws.dynamodb.get_paginator("scan").paginate(TableName=stack.ref("LedgerTable"))
        fates = [i["status"]["S"] for page in pages for i in page["Items"] if i["sk"]["S"].startswith("file#")]
        if fates.count("curated") != 2 * pairs:
            raise SystemExit(f"bench_intake: not every full-size object was curated: {sorted(set(fates))}")
        seconds = sum(i.duration_seconds for i in invocations)
        log(f"[full size] {received} objects in {len(invocations)} invocations, {seconds:.1f} s")
        return seconds / received


def report_full_size(pairs: int) -> None:
    batch_size, timeout, memory_mb = template_intake_settings()
    per_object = full_size_seconds_per_object(pairs)
    full_batch = per_object * batch_size
    vcpu = min(1.0, memory_mb / LAMBDA_MB_PER_VCPU)
    metric("intake_seconds_per_object_2048x1024", f"{per_object:.3f}")
    metric(
        "intake_full_batch_seconds",
        f"{full_batch:.1f} (extrapolated: {2 * pairs} objects timed, batch size {batch_size})",
    )
    metric("intake_function_timeout_seconds", timeout)
    metric("intake_batch_time_fraction", f"{full_batch / timeout:.3f}")
    metric("intake_lambda_vcpu_share", f"{vcpu:.2f} ({memory_mb} MB)")
    metric("intake_batch_time_fraction_at_lambda_cpu", f"{full_batch / timeout / vcpu:.3f}")


# ------------------------------------------------------------ cold start --
FUNCTION_ENVIRONMENT = {
    # What the template gives the intake function, with AWS's own variables for a Lambda.
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_LAMBDA_FUNCTION_NAME": "retrain-IntakeFunction",
    "LAMBDA_TASK_ROOT": str(ROOT),  # Powertools turns tracing on only inside Lambda
    "POWERTOOLS_SERVICE_NAME": "intake",
    "POWERTOOLS_METRICS_NAMESPACE": "Retrain",
    "POWERTOOLS_LOG_LEVEL": "INFO",
    "DATA_BUCKET": "retrain-data-123456789012-us-east-1",
    "LEDGER_TABLE": "retrain-LedgerTable",
    "IDEMPOTENCY_TABLE": "retrain-IdempotencyTable",
    "TRIGGER_FUNCTION": "retrain-TriggerFunction",
    "DATA_KEY_ARN": "arn:aws:kms:us-east-1:123456789012:key/00000000-0000-0000-0000-000000000000",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
}
TIMED_IMPORT = "import time; started = time.perf_counter(); import {module}; print(time.perf_counter() - started)"


def import_seconds(module: str, repeats: int) -> float:
    environment = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", ""),
        "PYTHONPATH": str(ROOT),
        **FUNCTION_ENVIRONMENT,
    }
    times = []
    for attempt in range(repeats + 1):
        done = subprocess.run(
            [sys.executable, "-c", TIMED_IMPORT.format(module=module)],
            capture_output=True,
            text=True,
            env=environment,
            cwd=ROOT,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"bench_intake: importing {module} failed:\n{done.stderr}")
        if attempt:  # the first one writes the bytecode caches
            times.append(float(done.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


# ---------------------------------------------------------- package size --
def makefile_words(variable: str) -> list[str]:
    """The words of a `NAME := ...` assignment in the Makefile (read, so the two cannot drift)."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    found = re.search(rf"^{variable}\s*:?=(.*)$", text, flags=re.MULTILINE)
    if found is None:
        raise SystemExit(f"bench_intake: the Makefile sets no {variable}")
    return shlex.split(found.group(1))


def build_requirements() -> tuple[list[str], list[str]]:
    """(installed with their dependencies, installed without) by the Makefile's `build-%` target."""
    if "-c $(ROOT)/constraints.txt" not in " ".join(makefile_words("LAMBDA_PIP")):
        raise SystemExit("bench_intake: build-% installs without constraints.txt")
    return makefile_words("LAMBDA_REQUIREMENTS"), makefile_words("LAMBDA_REQUIREMENTS_NO_DEPS")


def tree_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def top_level_sizes(folder: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for path in folder.iterdir():
        name = path.name
        size = tree_bytes(path) if path.is_dir() else path.stat().st_size
        sizes[name] = sizes.get(name, 0) + size
    return sizes


def make_build(target: Path) -> str | None:
    """`make build-IntakeFunction` into `target`, as `sam build` runs it; None when it worked,
    else the last line of its complaint."""
    command = ["make", "--no-print-directory", f"build-{INTAKE}", f"ARTIFACTS_DIR={target}"]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired:
        return "make took more than 300 s"
    complaint = [line for line in (done.stdout + done.stderr).splitlines() if "WARNING: Location" not in line]
    return None if done.returncode == 0 else (complaint or ["?"])[-1]


def closure(requirements: list[str]) -> list[metadata.Distribution]:
    """The installed distributions `requirements` pull in, markers and extras honoured."""
    found: dict[str, metadata.Distribution] = {}
    pending = [(Requirement(r), frozenset(Requirement(r).extras)) for r in requirements]
    while pending:
        requirement, extras = pending.pop()
        key = requirement.name.lower().replace("_", "-")
        if key in found:
            continue
        try:
            distribution = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            continue
        found[key] = distribution
        for text in distribution.requires or []:
            child = Requirement(text)
            marker = child.marker
            wanted = marker is None or any(marker.evaluate({"extra": extra}) for extra in (extras or {""}))
            if wanted:
                pending.append((child, frozenset(child.extras)))
    return list(found.values())


def installed_bytes(distributions: list[metadata.Distribution]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for distribution in distributions:
        total = 0
        for file in distribution.files or []:
            path = Path(str(distribution.locate_file(file)))
            if path.is_file():
                total += path.stat().st_size
        sizes[distribution.metadata["Name"]] = total
    return sizes


def zipped_bytes(folder: Path) -> int:
    with tempfile.TemporaryFile() as handle:
        with zipfile.ZipFile(handle, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(folder.rglob("*")):
                if path.is_file():
                    archive.write(path, path.relative_to(folder))
        return handle.tell()


SAM_BUILD = ROOT / ".aws-sam" / "build" / INTAKE


def sam_build_package() -> Path | None:
    """The intake package `make sam-build` left, where it is newer than what it is built from."""
    newest_input = max((ROOT / name).stat().st_mtime for name in ("Makefile", "constraints.txt"))
    if (SAM_BUILD / "functions").is_dir() and SAM_BUILD.stat().st_mtime > newest_input:
        return SAM_BUILD
    return None


def package_size(use_pip: bool) -> tuple[float, float | None, str, str, float, str]:
    """(MiB unzipped, MiB zipped or None, method, the largest parts, the intake package's MiB,
    where that was measured)."""
    requirements, without_dependencies = build_requirements()
    log(f"[package] make build-{INTAKE}: functions/ + {' '.join(requirements + without_dependencies)}")
    with tempfile.TemporaryDirectory() as scratch:
        artifact = Path(scratch) / "artifact"
        problem = make_build(artifact) if use_pip else "--installed-only"
        if problem is None:
            method = f"make build-{INTAKE} (the Makefile's build-% target, Lambda's platform wheels)"
            parts = top_level_sizes(artifact)
            names = {name.lower() for name in parts}
            total, zipped = tree_bytes(artifact), zipped_bytes(artifact)
        else:
            log(f"[package] the build failed ({problem}); measuring the installed distributions")
            method = f"installed distributions (importlib.metadata), not built: {problem}"
            shutil.rmtree(artifact, ignore_errors=True)
            shutil.copytree(
                ROOT / "functions",
                artifact / "functions",
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            )
            distributions = closure(requirements) + [metadata.distribution(name) for name in without_dependencies]
            parts = installed_bytes(distributions)
            parts["functions"] = tree_bytes(artifact / "functions")
            names = {name.lower() for name in parts}
            total, zipped = sum(parts.values()), None
    built = sam_build_package()
    if built is not None:
        intake, source = tree_bytes(built) / MIB, str(built.relative_to(ROOT))
    else:
        intake, source = total / MIB, method
    inside = sorted(
        name
        for name in names
        for forbidden in FORBIDDEN
        if name == forbidden or name.startswith((f"{forbidden}-", f"{forbidden}_"))
    )
    if inside:
        raise SystemExit(f"bench_intake: the Lambda package contains {', '.join(inside)}")
    largest = sorted(parts.items(), key=lambda item: item[1], reverse=True)[:4]
    described = ", ".join(f"{name} {size / MIB:.1f}" for name, size in largest)
    return total / MIB, (zipped / MIB if zipped is not None else None), method, described, intake, source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1000, help="objects in the burst (even)")
    parser.add_argument("--drops", type=int, default=3)
    parser.add_argument("--pairs-per-drop", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5, help="imports timed per module")
    parser.add_argument(
        "--full-size-pairs",
        type=int,
        default=20,
        help="2048x1024 pairs timed through the intake (extrapolated to a full batch)",
    )
    parser.add_argument("--full-size-only", action="store_true", help="only the 2048x1024 measurement")
    parser.add_argument(
        "--installed-only",
        action="store_true",
        help="measure the package from the installed distributions, without pip",
    )
    parser.add_argument("--package-only", action="store_true", help="only the package size figures")
    args = parser.parse_args()
    os.chdir(ROOT)
    started = time.monotonic()

    if args.package_only:
        report_package(use_pip=not args.installed_only)
        log(f"[done] in {time.monotonic() - started:.0f} s")
        return

    if args.full_size_only:
        report_full_size(args.full_size_pairs)
        log(f"[done] in {time.monotonic() - started:.0f} s")
        return

    per_thousand, per_invocation, batch_size, window, per_second = invocations_per_thousand(args.objects)
    metric("intake_objects_per_second_offline", f"{per_second:.1f}")
    metric("lambda_invocations_per_1000_objects", f"{per_thousand:.1f}")
    metric("intake_objects_per_invocation", f"{per_invocation:.1f}")
    metric("intake_batch_size_and_window", f"{batch_size} messages, {window:g} s")

    log(f"[drops] {args.drops} drops of {args.pairs_per_drop} pairs, one after another")
    metric("executions_per_data_drop", f"{executions_per_drop(args.drops, args.pairs_per_drop):g}")

    report_full_size(args.full_size_pairs)

    log(f"[imports] {args.repeats} fresh interpreters per module")
    intake = import_seconds("functions.intake.app", args.repeats)
    boto3 = import_seconds("boto3", args.repeats)
    metric("intake_cold_start_import_seconds", f"{intake:.3f}")
    metric("boto3_import_seconds", f"{boto3:.3f}")
    metric("intake_import_vs_boto3_ratio", f"{intake / boto3:.2f}")

    report_package(use_pip=not args.installed_only)
    log(f"[done] in {time.monotonic() - started:.0f} s")


def report_package(use_pip: bool) -> None:
    mib, zipped, method, largest, intake, source = package_size(use_pip)
    metric("deployed_package_mib", f"{mib:.1f}")
    if zipped is not None:
        metric("deployed_package_zipped_mib", f"{zipped:.1f}")
    metric("deployed_package_largest_mib", largest)
    metric("deployed_package_method", method)
    metric("intake_package_mb", f"{intake:.1f}")
    metric("intake_package_source", source)


if __name__ == "__main__":
    main()
