"""The files that are the contract between the trainer and the functions.

The trainer (`trainer/`) imports nothing from here: it writes plain JSON. These models are how the
functions (and the offline stack) read what it writes, and a test validates real trainer output
against them, so a change on either side that breaks the other fails there first.

- `ManifestEntry`: one line of `dataset/manifests/<version>.jsonl`, the frozen dataset version.
- `MetricsFile`: `metrics.json`, the lineage and results of one training run.
- `METRIC_DEFINITIONS`: the SageMaker `MetricDefinitions` that scrape the trainer's `METRIC` lines.

No torch here: Lambdas import this module.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

Split = Literal["train", "val"]

# A salt keeps the split independent of any other use of the image digest (e.g. sharding).
# It is public on purpose (issue 28): an annotator can tweak an image's bytes until it lands in the
# split they want, and a per-stack secret would not be worth what it costs.
# - What it would stop is small. Only their own pairs, whose labels they write anyway. Screening
#   checks every new pair in both splits; the gate scores on trusted pairs (validation pairs of
#   batches an accepted run trained on) and the benchmark batches, never trained on; a new batch's
#   validation pairs judge nothing until then (docs/screening.md). Leaking a gate image into
#   training as a near copy needs no choice of split: with a secret salt, it lands in training 90 %
#   of the time anyway; near-duplicate detection, not a salt, would stop that.
# - What it would break: a new salt moves existing pairs between splits in the next version, so
#   trusted validation pairs would be trained on and then score the model trained on them against
#   the accepted one, which was not; comparability over growing data is what this hash is for.
_SPLIT_SALT = b"retrain-split-v1:"


def split_for(image_sha256: str, val_fraction: float) -> Split:
    """The split of a pair, from its image's content hash alone.

    A pair never changes split as the dataset grows (for a fixed `val_fraction`), so runs over
    growing data are evaluated on a validation set that only ever gains members.
    """
    if not 0.0 <= val_fraction <= 1.0:
        raise ValueError(f"val_fraction must be within [0, 1], got {val_fraction}")
    digest = hashlib.sha256(_SPLIT_SALT + image_sha256.lower().encode("ascii")).digest()
    position = int.from_bytes(digest[:8], "big") / 2.0**64
    return "val" if position < val_fraction else "train"


def pair_digest(image_sha256: str, label_sha256: str) -> str:
    """A pair's content, short (16 hex digits): what its trust is kept under. A new label, or a
    new image, makes a new pair whatever the stem or batch."""
    return hashlib.sha256(f"{image_sha256.lower()}:{label_sha256.lower()}".encode("ascii")).hexdigest()[:16]


class ManifestEntry(BaseModel):
    """One image/label pair of a frozen dataset version.

    Paths are relative to the folder that holds `images/`, `labels/` and `manifests/` (the FSx
    mount on AWS); the digests and S3 VersionIds pin the exact bytes trained on.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    image: str = Field(min_length=1)
    label: str = Field(min_length=1)
    image_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    label_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    image_version_id: str | None = None
    label_version_id: str | None = None
    split: Split
    class_pixels: dict[str, int] = Field(default_factory=dict)
    batch: str = Field(min_length=1)
    # How far this pair's labels were trusted when the version was frozen (`Trust` in the ledger,
    # per pair content; held pairs are in no version): the trainer screens new and released
    # pairs, and judges the candidate on trusted and benchmark ones.
    trust: Literal["trusted", "new", "released", "benchmark"] = "new"
    # The annotation team: the batch name's part before its first "-" (the template's AnnotationTeams).
    team: str | None = None

    @property
    def digest(self) -> str:
        return pair_digest(self.image_sha256, self.label_sha256)


def team_of(batch: str) -> str:
    """Batches are named `<team>-<anything>`; the uploader policy holds each team to its own."""
    return batch.split("-", 1)[0]


_MANIFEST_ENTRY = TypeAdapter(ManifestEntry)


def parse_manifest(text: str) -> list[ManifestEntry]:
    """Every entry of a manifest's text; blank lines are skipped, a bad line names its number."""
    entries: list[ManifestEntry] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entries.append(_MANIFEST_ENTRY.validate_json(line))
        except ValueError as error:
            raise ValueError(f"manifest line {number} is not a valid entry: {error}") from error
    return entries


def dump_manifest(entries: list[ManifestEntry]) -> str:
    """The JSON-lines text of a manifest, one entry per line, keys in a stable order."""
    return "".join(entry.model_dump_json() + "\n" for entry in entries)


class RankTiming(BaseModel):
    """One rank's epoch: where its step time went (data wait + compute + communication = step)."""

    model_config = ConfigDict(extra="allow")

    rank: int = Field(ge=0)
    step_seconds: float = Field(ge=0.0)
    data_wait_seconds: float = Field(ge=0.0)
    compute_seconds: float = Field(ge=0.0)
    # The gradient all-reduce not hidden behind backward.
    communication_seconds: float = Field(ge=0.0)
    # Any all-reduce in flight, overlapped with backward or not.
    allreduce_seconds: float = Field(ge=0.0)
    stall_fraction: float = Field(ge=0.0, le=1.0)


class LoaderInfo(BaseModel):
    """How the run's input pipeline was laid out, to explain its stall fraction."""

    model_config = ConfigDict(extra="allow")

    decoder: str
    workers: int = Field(ge=0)
    prefetch_factor: int | None = None
    pin_memory: bool


class EpochMetrics(BaseModel):
    """What one epoch did: loss, validation quality, and how fast it went."""

    model_config = ConfigDict(extra="allow")

    epoch: int = Field(ge=1)
    train_loss: float
    lr: float
    # Mean IoU over the classes present in the validation split's labels or predictions.
    miou: float = Field(ge=0.0, le=1.0)
    # null for a class absent from both labels and predictions: it has no IoU, not an IoU of 0.
    per_class_iou: dict[str, float | None]
    # Time blocked waiting on the data loader / total step time, over all ranks.
    stall_fraction: float = Field(ge=0.0, le=1.0)
    images_per_sec: float = Field(ge=0.0)
    epoch_seconds: float = Field(ge=0.0)
    steps: int = Field(ge=0)
    # The rest of the step time, over all ranks: stall + compute + communication = 1. Optional:
    # trainers before the step timing (issue 6) did not write them.
    compute_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    communication_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    # Any gradient all-reduce in flight / step time (overlaps compute; not part of the sum).
    allreduce_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    ranks: list[RankTiming] | None = None


class BaselineMetrics(BaseModel):
    """The previously accepted model, evaluated on the same validation split in the same job."""

    model_config = ConfigDict(extra="allow")

    model: str
    miou: float = Field(ge=0.0, le=1.0)
    per_class_iou: dict[str, float | None]


class HostInfo(BaseModel):
    """Where the run ran: enough to reproduce or explain a throughput number."""

    model_config = ConfigDict(extra="allow")

    hostname: str
    platform: str
    python_version: str
    torch_version: str
    cuda_version: str | None = None
    device: str
    device_name: str | None = None
    world_size: int = Field(ge=1)
    backend: str
    cpu_count: int | None = None
    training_image: str | None = None
    training_job: str | None = None


class ChecksumMismatch(BaseModel):
    """A file the trainer read whose bytes are not the ones the manifest pins."""

    model_config = ConfigDict(extra="allow")

    path: str = Field(min_length=1)
    expected_sha256: str


class SplitChecksums(BaseModel):
    """One split's pairs checked against the manifest's sha256, over every rank, so far."""

    model_config = ConfigDict(extra="allow")

    pairs: int = Field(ge=0)
    # Distinct pairs read and hashed (a train pair is read every epoch; val pairs when evaluated).
    checked: int = Field(ge=0)
    # Distinct pairs with a file that differs: skipped, never trained or evaluated on.
    mismatched: int = Field(ge=0)
    # mismatched / pairs: what --max-checksum-mismatch-fraction bounds.
    fraction: float = Field(ge=0.0, le=1.0)
    # The first few files that differ.
    files: list[ChecksumMismatch] = Field(default_factory=list)


class ChecksumReport(BaseModel):
    """Whether what the trainer read is what the dataset version pins (`trainer/checksums.py`)."""

    model_config = ConfigDict(extra="allow")

    # False: the run did not check (--verify-checksums false); there are no split counts then.
    enabled: bool
    max_mismatch_fraction: float = Field(ge=0.0, le=1.0)
    train: SplitChecksums | None = None
    val: SplitChecksums | None = None
    # A split's fraction exceeded the maximum: the run stopped there.
    failed: bool = False


class WarmStartInfo(BaseModel):
    """Where a run's weights started (`trainer/warm_start.py`): a model file, or scratch and why."""

    model_config = ConfigDict(extra="allow")

    # "--init-from", "model channel", or why not: "--from-scratch", "no model channel", ...
    origin: str = Field(min_length=1)
    reason: str
    path: str | None = None
    kind: Literal["pt", "tar.gz"] | None = None
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class Scores(BaseModel):
    miou: float = Field(ge=0.0, le=1.0)
    per_class_iou: dict[str, float | None] = Field(default_factory=dict)


class BatchScores(BaseModel):
    """One batch of the version: its validation pairs under the candidate and the accepted model."""

    model_config = ConfigDict(extra="allow")

    trust: str
    held: bool = False
    val_pairs: int = Field(ge=0)
    candidate: Scores | None = None
    accepted: Scores | None = None


class TrustedScores(BaseModel):
    """The trusted evaluation set: validation pairs of trusted batches and every benchmark pair."""

    batches: list[str] = Field(default_factory=list)
    pairs: int = Field(default=0, ge=0)
    candidate: Scores | None = None
    accepted: Scores | None = None


class RunEvaluation(BaseModel):
    """`metrics.json`'s `evaluation` (trainer/screening/scores.py)."""

    batches: dict[str, BatchScores] = Field(default_factory=dict)
    trusted: TrustedScores = Field(default_factory=TrustedScores)
    trained_batches: list[str] = Field(default_factory=list)


class ScreenedBatchSummary(BaseModel):
    """One batch as a run's screening judged it (its pairs are in `screening.json`)."""

    model_config = ConfigDict(extra="allow")

    team: str = ""
    pair_count: int = Field(default=0, ge=0)
    judged: int = Field(default=0, ge=0)
    contradicted: int = Field(default=0, ge=0)
    verdict: str = ""
    held: bool = False

    @property
    def likely_error_share(self) -> float | None:
        """Of its judged pairs, the share the accepted model contradicted (None: none judged)."""
        return self.contradicted / self.judged if self.judged else None


# How the pictures of the pairs to fix are made (the template's HeldPairPictures, the trainer's
# --held-pair-pictures): blurred so no face or number plate can be read, as they are, or not at all.
PictureMode = Literal["blur", "show", "omit"]


class ScreeningSummary(BaseModel):
    """`metrics.json`'s `screening`; the details are in `screening.json` (trainer/screening/phase.py)."""

    model_config = ConfigDict(extra="allow")

    screened: bool
    why: str | None = None
    calibration: str | None = None  # independent | provisional
    held: list[str] = Field(default_factory=list)
    disputed: list[str] = Field(default_factory=list)
    left_out: int = Field(default=0, ge=0)
    batches: dict[str, ScreenedBatchSummary] = Field(default_factory=dict)
    # Trainers before the switch pictured the pairs as they are.
    pictures: PictureMode = "show"


class MetricsFile(BaseModel):
    """`metrics.json`: the lineage and results of one training run, rewritten every epoch."""

    model_config = ConfigDict(extra="allow")

    schema_version: Literal[1] = 1
    dataset_version: str = Field(min_length=1)
    code_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    torch_version: str
    host: HostInfo
    seed: int
    config: dict[str, object]
    classes: list[str] = Field(min_length=1)
    train_images: int = Field(ge=0)
    val_images: int = Field(ge=0)
    init_from: str | None = None
    # Optional: trainers before model.tar.gz warm starts did not write it.
    warm_start: WarmStartInfo | None = None
    resumed_from: str | None = None
    loader: LoaderInfo | None = None
    epochs: list[EpochMetrics]
    miou: float | None = Field(default=None, ge=0.0, le=1.0)
    per_class_iou: dict[str, float | None] = Field(default_factory=dict)
    baseline: BaselineMetrics | None = None
    # Optional: trainers before the manifest's pins were checked did not write it.
    checksums: ChecksumReport | None = None
    # Optional: trainers before label screening (issue 26) did not write them.
    evaluation: RunEvaluation | None = None
    screening: ScreeningSummary | None = None
    complete: bool = False


class MetricDefinition(BaseModel):
    """One SageMaker `MetricDefinitions` item, in the API's own spelling."""

    model_config = ConfigDict(populate_by_name=True, frozen=True)

    name: str = Field(alias="Name", min_length=1, max_length=255)
    regex: str = Field(alias="Regex", min_length=1, max_length=500)


# A number as the trainer prints it (`{:.4f}`-style, or nan/inf should something diverge).
_NUMBER = r"(-?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|nan|inf))"

# The trainer prints, on rank 0 only, lines such as
#   METRIC epoch=3 train_loss=0.4123 val_miou=0.5512 stall_fraction=0.0310 images_per_sec=41.2 ...
#   METRIC baseline_miou=0.4812
# No `^`: a launcher may prefix each line (e.g. `[default0]:`). `\b` keeps `val_miou` from
# matching inside a longer name such as `baseline_val_miou`.
METRIC_FIELDS: dict[str, str] = {
    "epoch": "epoch",
    "train:loss": "train_loss",
    "train:lr": "lr",
    "validation:miou": "val_miou",
    "train:stall_fraction": "stall_fraction",
    "train:compute_fraction": "compute_fraction",
    "train:communication_fraction": "communication_fraction",
    "train:images_per_sec": "images_per_sec",
    "train:epoch_seconds": "epoch_seconds",
    "validation:baseline_miou": "baseline_miou",
}

METRIC_DEFINITIONS: list[MetricDefinition] = [
    MetricDefinition(name=name, regex=rf"\bMETRIC\b.*?\b{field}={_NUMBER}") for name, field in METRIC_FIELDS.items()
]


def metric_definitions() -> list[dict[str, str]]:
    """`MetricDefinitions` for CreateTrainingJob's AlgorithmSpecification."""
    return [definition.model_dump(by_alias=True) for definition in METRIC_DEFINITIONS]


def scrape_metrics(log: str) -> dict[str, list[float]]:
    """Every value each metric definition finds in a log, in order, as SageMaker would see them."""
    found: dict[str, list[float]] = {}
    for definition in METRIC_DEFINITIONS:
        pattern = re.compile(definition.regex)
        # SageMaker applies each regex to each log line: one value per line at most.
        values = [float(match.group(1)) for line in log.splitlines() if (match := pattern.search(line)) is not None]
        if values:
            found[definition.name] = values
    return found
