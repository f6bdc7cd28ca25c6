"""The one place that knows the data bucket's layout (DESIGN.md section 3).

```
incoming/<batch>/images|labels/<file>        what annotators upload (the notification prefix)
incoming/<batch>/_COMPLETE                   optional: closes the batch at once
dataset/images|labels/<batch>/<file>         curated pairs (what FSx for Lustre links to)
dataset/manifests/<version>.jsonl            frozen dataset versions (+ .purged.json after erasure)
quarantine/<batch>/<file> + .reason.json     rejected files and why
reports/<batch>/report.json|md               batch reports
reports/runs/<run>/                          a run's summary.json, metrics.json, rules.json, report.html
models/accepted.json                         the accepted model (what the next run starts from)
models/runs/<run>/model.pt                   each evaluated run's weights (a training job's model channel)
code/sourcedir.tar.gz                        the trainer as SageMaker receives it
training/<job>/...                           SageMaker's output: model.tar.gz, output.tar.gz, rule-output/
```
Nothing outside `incoming/` triggers the intake (the bucket notifies on that prefix only).
Files uploaded straight under `incoming/` (no batch folder) belong to the batch `_unbatched`.
"""

from __future__ import annotations

INCOMING = "incoming/"
DATASET = "dataset/"
MANIFESTS = "dataset/manifests/"
QUARANTINE = "quarantine/"
REPORTS = "reports/"
RUN_REPORTS = "reports/runs/"
MODELS = "models/"
ACCEPTED_MODEL = "models/accepted.json"
TRAINER_CODE = "code/sourcedir.tar.gz"
TRAINING_OUTPUT = "training/"

IMAGES_DIR = "images"
LABELS_DIR = "labels"
PAIR_FOLDERS = (IMAGES_DIR, LABELS_DIR)
COMPLETE_MARKER = "_COMPLETE"
UNBATCHED = "_unbatched"

MANIFEST_SUFFIX = ".jsonl"
PURGED_SUFFIX = ".purged.json"
REASON_SUFFIX = ".reason.json"


def batch_of(key: str) -> str | None:
    """`incoming/<batch>/...` -> `<batch>`; None for a key outside the landing zone."""
    if not key.startswith(INCOMING):
        return None
    batch, sep, rest = key[len(INCOMING) :].partition("/")
    return batch if batch and sep and rest else None


def landing_key(batch: str, relative: str) -> str:
    """`images/x.jpg` of batch `b` -> `incoming/b/images/x.jpg` (unbatched: `incoming/...`)."""
    return f"{INCOMING}{relative if batch == UNBATCHED else f'{batch}/{relative}'}"


def manifest_key(dataset_version: str) -> str:
    return f"{MANIFESTS}{dataset_version}{MANIFEST_SUFFIX}"


def manifest_version(key: str) -> str | None:
    """`dataset/manifests/<version>.jsonl` -> `<version>`; None for any other key."""
    name = key.removeprefix(MANIFESTS)
    if name == key or "/" in name or not name.endswith(MANIFEST_SUFFIX):
        return None
    return name.removesuffix(MANIFEST_SUFFIX)


def purged_record_key(manifest: str) -> str:
    """Where an erasure records what it took out of a manifest."""
    return manifest.removesuffix(MANIFEST_SUFFIX) + PURGED_SUFFIX


def curated_key(batch: str, relative: str) -> str:
    """`images/<name>` of batch `b` -> `dataset/images/b/<name>` (labels alike)."""
    folder, _, name = relative.partition("/")
    return f"{DATASET}{folder}/{batch}/{name}"


def quarantine_key(batch: str, relative: str) -> str:
    return f"{QUARANTINE}{batch}/{relative}"


def reason_key(quarantined: str) -> str:
    return f"{quarantined}{REASON_SUFFIX}"


def report_key(batch: str, name: str) -> str:
    return f"{REPORTS}{batch}/{name}"


def run_report_key(run: str, name: str) -> str:
    return f"{RUN_REPORTS}{run}/{name}"


def run_weights_prefix(run: str) -> str:
    """The folder holding a run's `model.pt`: the next run's model channel (warm start)."""
    return f"{MODELS}runs/{run}/"


def relative_to_batch(key: str) -> str:
    """`incoming/<batch>/images/x.jpg` -> `images/x.jpg`."""
    batch = batch_of(key)
    return key[len(INCOMING) + len(batch) + 1 :] if batch else key.removeprefix(INCOMING)


def pair_folders(batch: str) -> list[str]:
    """Every folder a pair's files can be in: landing, curated and quarantine zones."""
    return [
        zone
        for folder in PAIR_FOLDERS
        for zone in (
            f"{INCOMING}{batch}/{folder}/",
            f"{DATASET}{folder}/{batch}/",
            f"{QUARANTINE}{batch}/{folder}/",
        )
    ]


def split_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/key` -> (`bucket`, `some/key`)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key
