"""The trainer as SageMaker receives it: `sourcedir.tar.gz`, built reproducibly from `trainer/`,
and released to a stack's data bucket.

SageMaker's PyTorch container unpacks the archive into /opt/ml/code and runs `train.py` from there
(script mode). The same archive, built from the same sources, is byte for byte the same (sorted
entries, fixed times, owners and modes, no caches), so its sha256 names the code: the release
stores it under that digest, every run fixes the digest when it starts and refuses an archive
that no longer has it (`functions/common/trainer_code.py`), and the job's tags carry it. The
offline emulator runs this very archive.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import tarfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from botocore.exceptions import ClientError

from functions.common import prefixes
from functions.common.models import TrainerRelease
from functions.common.trainer_code import archive_sha256

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

TRAINER_DIR = Path(__file__).resolve().parents[1] / "trainer"
ARCHIVE_NAME = prefixes.TRAINER_ARCHIVE
# Python sources only: no caches, no editor files, nothing a build left behind.
INCLUDED_SUFFIXES = frozenset({".py"})
_FIXED_MTIME = 0


@dataclass(frozen=True)
class TrainerArchive:
    path: Path
    sha256: str
    files: tuple[str, ...]


@dataclass(frozen=True)
class Released:
    """What a release did: the archive's place, and what it found there."""

    uri: str
    sha256: str
    # "stored": a new archive; "present": these bytes were there already (a release repeated);
    # "restored": other bytes were there, replaced by these (`replaced_sha256` says whose).
    outcome: Literal["stored", "present", "restored"]
    replaced_sha256: str | None = None


def trainer_files(source: Path = TRAINER_DIR) -> list[Path]:
    """The files that go into the archive, in archive order."""
    return sorted(
        path
        for path in source.rglob("*")
        if path.is_file() and path.suffix in INCLUDED_SUFFIXES and "__pycache__" not in path.parts
    )


def build_sourcedir(out_dir: Path, source: Path = TRAINER_DIR) -> TrainerArchive:
    """Write `out_dir/sourcedir.tar.gz` (train.py at its root, as SageMaker expects)."""
    files = trainer_files(source)
    if not any(path.name == "train.py" and path.parent == source for path in files):
        raise FileNotFoundError(f"{source} has no train.py: not the trainer's folder")
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path in files:
            data = path.read_bytes()
            info = tarfile.TarInfo(path.relative_to(source).as_posix())
            info.size, info.mtime, info.mode = len(data), _FIXED_MTIME, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            archive.addfile(info, io.BytesIO(data))
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / ARCHIVE_NAME
    # gzip records a time and a file name in its header: neither may change the bytes.
    with (
        target.open("wb") as raw,
        gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=_FIXED_MTIME) as zipped,
    ):
        zipped.write(tar_bytes.getvalue())
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    (out_dir / f"{ARCHIVE_NAME}.sha256").write_text(f"{digest}  {ARCHIVE_NAME}\n")
    return TrainerArchive(target, digest, tuple(p.relative_to(source).as_posix() for p in files))


def release_trainer(s3: S3Client, bucket: str, archive: TrainerArchive, *, now: datetime | None = None) -> Released:
    """Store `archive` under its sha256 and make it the release new runs train with.

    The archive is written only where nothing is (If-None-Match), with its SHA-256 for S3 to check
    on arrival; then `code/current.json` names it, last, so no run is ever pointed at an archive
    that is not there yet. Finding other bytes at the archive's key means someone replaced them:
    the release restores its own and says so (only the release path may write under `code/`).
    """
    key = prefixes.trainer_code_key(archive.sha256)
    uri = f"s3://{bucket}/{key}"
    body = archive.path.read_bytes()
    checksum = base64.b64encode(bytes.fromhex(archive.sha256)).decode()
    outcome: Literal["stored", "present", "restored"] = "stored"
    replaced = None
    try:
        s3.put_object(Bucket=bucket, Key=key, Body=body, ChecksumSHA256=checksum, IfNoneMatch="*")
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") not in {"PreconditionFailed", "ConditionalRequestConflict"}:
            raise
        found = archive_sha256(s3, uri)
        if found == archive.sha256:
            outcome = "present"
        else:
            s3.put_object(Bucket=bucket, Key=key, Body=body, ChecksumSHA256=checksum)
            outcome, replaced = "restored", found
    release = TrainerRelease(sha256=archive.sha256, released_at=now or datetime.now(UTC))
    s3.put_object(
        Bucket=bucket,
        Key=prefixes.TRAINER_RELEASE,
        Body=release.model_dump_json().encode(),
        ContentType="application/json",
    )
    return Released(uri=uri, sha256=archive.sha256, outcome=outcome, replaced_sha256=replaced)
