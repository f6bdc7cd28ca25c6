"""The one place that knows the data bucket's layout (docs/intake.md; docs/architecture.md says where new keys go).

```
incoming/<batch>/images|labels/<file>        what annotators upload (the notification prefix)
incoming/<batch>/_COMPLETE                   optional: closes the batch at once
dataset/images|labels/<batch>/<file>         curated pairs (what FSx for Lustre links to)
dataset/manifests/<version>.jsonl            frozen dataset versions (+ .purged.json after erasure)
quarantine/<batch>/<file> + .reason.json     rejected files and why
quarantine/_unsafe/<sha256> + .reason.json   files whose key is unsafe or too long to reuse as a key
reports/batches/<batch>/report.json|md       batch reports (intake, sweeper; a held batch's: EvaluateRun)
reports/runs/<run>/                          an evaluated run's summary.json, metrics.json, rules.json,
                                             report.html: EvaluateRun's alone (the bucket policy says so)
reports/failures/<run>/summary.json          a run that ended before its evaluation: failed or stopped
reports/index.html                           every run on one page (EvaluateRun)
models/accepted.json                         the accepted model (what the next run starts from)
models/runs/<run>/model.pt                   each accepted run's weights (a training job's model channel)
models/packages/<run>/model.tar.gz           an accepted model's sealed copy: written once, never replaced
                                             or deleted; its sha256 is in the model package
code/<sha256>/sourcedir.tar.gz               each released trainer, under its archive's sha256
code/current.json                            the release new runs train with (its sha256)
training/<job>/...                           SageMaker's output: model.tar.gz, output.tar.gz, rule-output/
```
Nothing outside `incoming/` triggers the intake (the bucket notifies on that prefix only).
Only the release path writes under `code/` (the bucket policy denies everyone else).
Batch and run reports have folders of their own, so no batch name (`runs`, `index.html`) can
reach a run's evidence. Before issue 28 batch reports were `reports/<batch>/`: nothing writes
there any more, and an erasure still removes them (`legacy_report_key`).
Files uploaded straight under `incoming/` (no batch folder) belong to the batch `_unbatched`;
files whose batch folder is unsafe (`..`, a control character, ...) to the batch `_unsafe`.
"""

from __future__ import annotations

import hashlib

INCOMING = "incoming/"
DATASET = "dataset/"
MANIFESTS = "dataset/manifests/"
QUARANTINE = "quarantine/"
REPORTS = "reports/"
BATCH_REPORTS = "reports/batches/"
RUN_REPORTS = "reports/runs/"
FAILED_RUNS = "reports/failures/"
MODELS = "models/"
MODEL_PACKAGES = "models/packages/"
ACCEPTED_MODEL = "models/accepted.json"
CODE = "code/"
TRAINER_RELEASE = "code/current.json"
TRAINER_ARCHIVE = "sourcedir.tar.gz"
TRAINING_OUTPUT = "training/"

IMAGES_DIR = "images"
LABELS_DIR = "labels"
PAIR_FOLDERS = (IMAGES_DIR, LABELS_DIR)
COMPLETE_MARKER = "_COMPLETE"
UNBATCHED = "_unbatched"
# The ledger batch of uploads whose batch folder is unsafe, and the quarantine folder of every
# upload refused as `unsafe_name`. An unsafe batch folder is never reused: it would become a ledger
# partition, a report folder (`reports/../report.json`) and a quarantine folder. A real batch may
# be called `_unsafe` too; it then shares the partition, as one called `_unbatched` does.
UNSAFE = "_unsafe"

# The longest landing key (UTF-8 bytes) the intake acts on; longer ones are refused as
# `unsafe_name`. Every key derived from a landing key of L bytes, with a batch of B bytes:
#   dataset/<folder>/<B>/<name>            L - 1        (unbatched: L + 10)
#   quarantine/<B>/<relative>              L + 2        (unbatched: L + 13)
#   ... + .reason.json                     L + 14       (unbatched: L + 25)  <= 1,024 (S3)
#   ledger sort key file#<key>#<version>   L + 6 + V                         <= 1,024 (DynamoDB)
# where V is the version: S3 VersionIds have 32 bytes (moto's 36, an ETag fallback at most 40);
# we allow 128. So L <= min(1,024 - 25, 1,024 - 6 - 128) = min(999, 890) = 890.
# Not bound by L: the ledger partition `batch#<B>` (B <= 255, a segment; 2,048 allowed), the pair's
# sort key `pair#<stem>` and the state index's `<B>#<stem>` (a stem is <= 255 bytes, 765 after NFC
# at worst: <= 1,021), the idempotency key (`intake.object-version#` + an MD5: 54 bytes).
# `tests/unit/test_key_limits.py` derives each of them from keys of this length.
S3_MAX_KEY_BYTES = 1024
VERSION_BUDGET_BYTES = 128
MAX_INCOMING_KEY_BYTES = 890

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


def unsafe_quarantine_key(key: str) -> str:
    """Where a landing key refused as `unsafe_name` is quarantined: named by its SHA-256, never by
    itself, so it is safe, short and the same on every redelivery. The key is kept in the
    `.reason.json` beside it and in the ledger record."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{QUARANTINE}{UNSAFE}/{digest}"


def reason_key(quarantined: str) -> str:
    return f"{quarantined}{REASON_SUFFIX}"


def report_key(batch: str, name: str) -> str:
    return f"{BATCH_REPORTS}{batch}/{name}"


def legacy_report_key(batch: str, name: str) -> str:
    """Where a batch's report was before it had a folder of its own: only an erasure looks there."""
    return f"{REPORTS}{batch}/{name}"


def run_report_key(run: str, name: str) -> str:
    """An evaluated run's reports: EvaluateRun is the only writer (the evidence behind a model)."""
    return f"{RUN_REPORTS}{run}/{name}"


def trainer_code_key(sha256: str) -> str:
    """Where the trainer whose archive has this sha256 lives: never overwritten, so a run that
    starts with a digest finds those bytes, or other bytes that the run then refuses."""
    return f"{CODE}{sha256}/{TRAINER_ARCHIVE}"


def failed_run_key(run: str, name: str) -> str:
    """What NotifyFunction records of a run that ended before its evaluation (failed or stopped)."""
    return f"{FAILED_RUNS}{run}/{name}"


def summary_keys(run: str) -> tuple[str, str]:
    """Where a run's summary.json may be, the one to believe first: a failure is recorded after
    anything an evaluation wrote (a run stopped while the team was being told), so it wins."""
    return failed_run_key(run, "summary.json"), run_report_key(run, "summary.json")


def package_model_key(run: str) -> str:
    """An accepted model's sealed copy, which its model package names (and pins by sha256)."""
    return f"{MODEL_PACKAGES}{run}/model.tar.gz"


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
