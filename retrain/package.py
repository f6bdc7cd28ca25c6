"""The trainer as SageMaker receives it: `sourcedir.tar.gz`, built reproducibly from `trainer/`.

SageMaker's PyTorch container unpacks the archive into /opt/ml/code and runs `train.py` from there
(script mode). The same archive, built from the same sources, is byte for byte the same (sorted
entries, fixed times, owners and modes, no caches), so its sha256 names the code: it goes into the
job's tags and `metrics.json`'s lineage, and the offline emulator runs this very archive.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path

TRAINER_DIR = Path(__file__).resolve().parents[1] / "trainer"
ARCHIVE_NAME = "sourcedir.tar.gz"
# Python sources only: no caches, no editor files, nothing a build left behind.
INCLUDED_SUFFIXES = frozenset({".py"})
_FIXED_MTIME = 0


@dataclass(frozen=True)
class TrainerArchive:
    path: Path
    sha256: str
    files: tuple[str, ...]


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
