"""What a run's weights start from: an accepted model (`model.pt`, or SageMaker's `model.tar.gz`),
or random weights, and why.

The `model` channel (`SM_CHANNEL_MODEL`) is a folder. The training-job function and the offline
stack fill it from the accepted model's weights prefix (`models/runs/<run>/`, which holds
`model.pt`); a channel pointed at a job's output instead holds `model.tar.gz`, SageMaker's packing
of the job's model folder. Both are accepted, and so is either as `--init-from` or
`--baseline-model`. A file is told by its content (gzip or not), not by its name.

An archive is read as little as it can be: only its `model.pt` member, into memory, never unpacked
to disk. An archive naming any member outside its own root (an absolute path, or `..`) is refused
whole: SageMaker never writes one, so whatever wrote it is not to be trusted with a path.

Every outcome is a `WarmStart`: it makes the log line a person reads and the `warm_start` entry of
metrics.json, including the from-scratch ones, which say why (no channel, an empty channel, ...).
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

MODEL_FILE = "model.pt"
ARCHIVE_FILE = "model.tar.gz"
# BiSeNetV2 at width 1.0 is about 14 MB; a member this large is not a model of ours, and it would
# have to sit in memory.
MAX_MODEL_BYTES = 1 << 30
GZIP_MAGIC = b"\x1f\x8b"

Kind = Literal["pt", "tar.gz"]


class ModelArchiveError(ValueError):
    """A model.tar.gz that is not a packed model folder with one `model.pt` in it."""


@dataclass(frozen=True)
class WarmStart:
    """Where the weights come from. `path` is None when training from scratch."""

    origin: str  # "--init-from", "model channel", or why not: "--from-scratch", "no model channel", ...
    reason: str  # one sentence for the log and metrics.json
    path: Path | None = None
    kind: Kind | None = None
    sha256: str | None = None

    def lineage(self) -> dict[str, Any]:
        """metrics.json's `warm_start`."""
        return {
            "origin": self.origin,
            "reason": self.reason,
            "path": str(self.path) if self.path is not None else None,
            "kind": self.kind,
            "sha256": self.sha256,
        }

    def describe(self) -> str:
        if self.path is None:
            return f"training from scratch ({self.origin}): {self.reason}"
        member = f"{MODEL_FILE} inside " if self.kind == "tar.gz" else ""
        return f"warm start from {member}{self.path} ({self.origin}, sha256 {self.sha256}): {self.reason}"


def resolve(*, init_from: str | None, from_scratch: bool, channel: str | None) -> WarmStart:
    """`--from-scratch`, else `--init-from`, else the model channel's model."""
    if from_scratch:
        return WarmStart("--from-scratch", "--from-scratch was given; any --init-from or model channel is ignored")
    if init_from:
        path = Path(init_from)
        if not path.is_file():
            raise SystemExit(f"--init-from {path}: no such file (a model.pt or a model.tar.gz)")
        return _found(path, "--init-from", "named by --init-from")
    return from_channel(channel)


def from_channel(channel: str | None) -> WarmStart:
    """The model channel's `model.pt`, else its `model.tar.gz`, else scratch with the reason."""
    if not channel:
        return WarmStart(
            "no model channel",
            "SM_CHANNEL_MODEL is not set: the job was given no accepted model (a first run starts so)",
        )
    folder = Path(channel)
    if not folder.is_dir():
        return WarmStart("model channel missing", f"SM_CHANNEL_MODEL names {folder}, which is not a folder")
    for name in (MODEL_FILE, ARCHIVE_FILE):
        if (folder / name).is_file():
            return _found(folder / name, "model channel", f"the model channel's {name}")
    present = sorted(path.name for path in folder.iterdir())
    if not present:
        return WarmStart("model channel empty", f"the model channel {folder} is empty")
    listed = ", ".join(present[:10]) + (", ..." if len(present) > 10 else "")
    return WarmStart(
        "no model in channel",
        f"the model channel {folder} holds neither {MODEL_FILE} nor {ARCHIVE_FILE} (it has: {listed})",
    )


def _found(path: Path, origin: str, reason: str) -> WarmStart:
    return WarmStart(origin, reason, path=path, kind=kind_of(path), sha256=sha256(path))


def kind_of(path: Path) -> Kind:
    with path.open("rb") as handle:
        return "tar.gz" if handle.read(2) == GZIP_MAGIC else "pt"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_source(path: Path) -> Path | io.BytesIO:
    """What `torch.load` reads: the file itself, or the archive's `model.pt`, in memory."""
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {path}")
    return io.BytesIO(read_archive_model(path)) if kind_of(path) == "tar.gz" else path


def read_archive_model(path: Path) -> bytes:
    """The bytes of the one `model.pt` member of a model.tar.gz, after checking every member name."""
    try:
        with tarfile.open(path, mode="r:gz") as archive:
            members = archive.getmembers()
            for member in members:
                _check_name(path, member.name)
            model = _model_member(path, members)
            handle = archive.extractfile(model)
            if handle is None:
                raise ModelArchiveError(f"{path}: {model.name} cannot be read")
            return handle.read()
    except (tarfile.TarError, EOFError, OSError) as error:
        raise ModelArchiveError(f"{path} is not a readable model.tar.gz ({error})") from error


def _check_name(path: Path, name: str) -> None:
    member = PurePosixPath(name)
    if member.is_absolute() or ".." in member.parts:
        raise ModelArchiveError(
            f"{path} has a member outside the archive ({name!r}); SageMaker never writes one, so "
            "the archive is refused whole"
        )


def _model_member(path: Path, members: list[tarfile.TarInfo]) -> tarfile.TarInfo:
    # SageMaker packs the model folder's files at the archive's root; `./model.pt` is the same name.
    found = [member for member in members if PurePosixPath(member.name).parts == (MODEL_FILE,)]
    if len(found) != 1:
        names = ", ".join(member.name for member in members[:10]) or "nothing"
        raise ModelArchiveError(f"{path} should hold one {MODEL_FILE} at its root; it holds {names}")
    model = found[0]
    if not model.isfile():
        raise ModelArchiveError(f"{path}: {model.name} is a link or special file, not a model file")
    if model.size > MAX_MODEL_BYTES:
        raise ModelArchiveError(f"{path}: {model.name} is {model.size} bytes, more than a model of ours")
    return model
