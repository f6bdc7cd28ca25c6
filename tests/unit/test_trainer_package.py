"""The trainer as SageMaker receives it: reproducible, self-contained, runnable in AWS's image; and
released to a stack under its sha256, so that what a run started with cannot change under it."""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from typer.testing import CliRunner

from functions.common import clients
from functions.common.trainer_code import released_trainer
from retrain.cli import app
from retrain.commands import package as package_command
from retrain.package import TRAINER_DIR, TrainerArchive, build_sourcedir, release_trainer, trainer_files
from retrain.target import StackTarget
from tests.unit.fakes import versioned_bucket

BUCKET = "retrain-data-123456789012-us-east-1"

# What AWS's PyTorch training images carry; anything else the trainer may only try to import.
IN_THE_IMAGE = {"torch", "numpy", "PIL"}
OPTIONAL = {"psutil", "pynvml", "simplejpeg", "turbojpeg", "cv2", "smdistributed"}


def test_the_same_sources_build_the_same_bytes(tmp_path: Path) -> None:
    first = build_sourcedir(tmp_path / "a")
    second = build_sourcedir(tmp_path / "b")

    assert first.sha256 == second.sha256
    assert (tmp_path / "a" / "sourcedir.tar.gz.sha256").read_text().startswith(first.sha256)


def test_train_py_is_at_the_root_and_nothing_but_sources_is_packed(tmp_path: Path) -> None:
    archive = build_sourcedir(tmp_path)

    with tarfile.open(archive.path) as packed:
        names = packed.getnames()
        owners = {(member.uid, member.gid, member.mtime) for member in packed.getmembers()}
    assert "train.py" in names and "profiling/rules/__init__.py" in names
    assert all(name.endswith(".py") and "__pycache__" not in name for name in names)
    assert owners == {(0, 0, 0)}, "no build machine's users or times in the archive"


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level module, imported unguarded at module level) for every absolute import."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try | ast.FunctionDef | ast.AsyncFunctionDef | ast.If):
            guarded.update(id(inner) for inner in ast.walk(node) if inner is not node)
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [(name.split(".")[0], id(node) not in guarded) for name in names]
    return found


def test_the_trainer_needs_nothing_the_training_image_lacks() -> None:
    problems = []
    for path in sorted(TRAINER_DIR.rglob("*.py")):
        for module, unguarded in _imports(path):
            if module in sys.stdlib_module_names or module in {"trainer", "__future__"} | IN_THE_IMAGE:
                continue
            where = path.relative_to(TRAINER_DIR)
            if module not in OPTIONAL:
                problems.append(f"{where} imports {module}, which AWS's PyTorch image does not have")
            elif unguarded:
                problems.append(f"{where} imports the optional {module} without a fallback")
    assert problems == []


# ------------------------------------------------------------------ release --
@pytest.fixture
def s3() -> Iterator[Any]:
    with versioned_bucket(BUCKET) as client:
        yield client


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> TrainerArchive:
    return build_sourcedir(tmp_path_factory.mktemp("trainer"))


def versions(s3: Any, key: str) -> list[str]:
    return [v["VersionId"] for v in s3.list_object_versions(Bucket=BUCKET, Prefix=key).get("Versions", [])]


def test_a_release_stores_the_archive_under_its_sha256_and_then_names_it_for_new_runs(
    s3: Any, archive: TrainerArchive
) -> None:
    released = release_trainer(s3, BUCKET, archive)

    key = f"code/{archive.sha256}/sourcedir.tar.gz"
    assert (released.uri, released.outcome) == (f"s3://{BUCKET}/{key}", "stored")
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == archive.path.read_bytes()
    assert json.loads(s3.get_object(Bucket=BUCKET, Key="code/current.json")["Body"].read())["sha256"] == archive.sha256
    code = released_trainer(s3, BUCKET)
    assert (code.uri, code.sha256) == (released.uri, archive.sha256), "what PrepareRun fixes for the next run"


def test_a_repeated_release_leaves_the_archive_untouched(s3: Any, archive: TrainerArchive) -> None:
    first = release_trainer(s3, BUCKET, archive)
    before = versions(s3, f"code/{archive.sha256}/")

    again = release_trainer(s3, BUCKET, archive)

    assert (first.outcome, again.outcome) == ("stored", "present")
    assert versions(s3, f"code/{archive.sha256}/") == before, "never overwritten"


def test_a_release_restores_an_archive_someone_replaced_and_says_whose_bytes_it_found(
    s3: Any, archive: TrainerArchive
) -> None:
    key = f"code/{archive.sha256}/sourcedir.tar.gz"
    release_trainer(s3, BUCKET, archive)
    other = b"another train.py, packed under the released trainer's key"
    s3.put_object(Bucket=BUCKET, Key=key, Body=other)

    restored = release_trainer(s3, BUCKET, archive)

    assert (restored.outcome, restored.replaced_sha256) == ("restored", hashlib.sha256(other).hexdigest())
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == archive.path.read_bytes()


def test_releasing_to_a_deployed_stack_writes_as_its_release_role(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make upload-trainer STACK=retrain`: the only principal the bucket lets write under code/."""
    role = boto3.client("iam", region_name="us-east-1").create_role(
        RoleName="retrain-TrainerReleaseRole-AbC", AssumeRolePolicyDocument="{}"
    )["Role"]["Arn"]
    deployed = StackTarget(
        name="retrain",
        kind="aws",
        region="us-east-1",
        endpoint_url=None,
        outputs={"DataBucketName": BUCKET, "TrainerReleaseRoleArn": role},
        session=boto3.session.Session(region_name="us-east-1"),
    )
    monkeypatch.setattr(package_command.targets, "resolve", lambda stack, region: deployed)
    made: dict[str, dict[str, Any]] = {}
    real_make = clients.make

    def make(service: str, **options: Any) -> Any:
        made[service] = options
        return real_make(service, **options)

    monkeypatch.setattr(clients, "make", make)

    package_command.command(tmp_path, stack="retrain", bucket=None, region=None)

    sha256 = (tmp_path / "sourcedir.tar.gz.sha256").read_text().split()[0]
    assert released_trainer(s3, BUCKET).sha256 == sha256
    writer = boto3.client("sts", region_name="us-east-1", **_keys(made["s3"]["credentials"]))
    assert writer.get_caller_identity()["Arn"].endswith(
        ":assumed-role/retrain-TrainerReleaseRole-AbC/retrain-package-trainer"
    ), "the release wrote as someone other than the stack's release role"


def _keys(credentials: tuple[str, str, str]) -> dict[str, str]:
    key_id, secret, token = credentials
    return {"aws_access_key_id": key_id, "aws_secret_access_key": secret, "aws_session_token": token}


def test_package_trainer_json_names_the_archive_and_its_release(s3: Any, tmp_path: Path) -> None:
    built = CliRunner().invoke(app, ["package-trainer", str(tmp_path / "local"), "--json"])
    released = CliRunner().invoke(app, ["package-trainer", str(tmp_path / "out"), "--bucket", BUCKET, "--json"])

    assert built.exit_code == 0, built.output
    document = json.loads(built.stdout)
    assert document["archive"]["path"] == str(tmp_path / "local" / "sourcedir.tar.gz")
    assert document["released"] is None, "no --stack or --bucket: nothing released"
    assert released.exit_code == 0, released.output
    document = json.loads(released.stdout)
    sha256 = (tmp_path / "out" / "sourcedir.tar.gz.sha256").read_text().split()[0]
    assert document["archive"]["sha256"] == sha256
    assert document["archive"]["files"] == [path.relative_to(TRAINER_DIR).as_posix() for path in trainer_files()]
    assert document["released"] == {
        "uri": f"s3://{BUCKET}/code/{sha256}/sourcedir.tar.gz",
        "sha256": sha256,
        "outcome": "stored",
        "replaced_sha256": None,
    }
    assert "released s3://" in released.stderr, "the words go to stderr"
