"""Label validation: every image/mask pair checked, every defect named.

Pure Python on Pillow (no AWS SDK, no numpy, no torch) so the intake Lambda stays small. The
checks take bytes or a binary file object plus the object's key, never a path; duplicate
detection and Ground Truth source reads go through small injected protocols.

The intake Lambda, one object at a time, in a child process killed at a time limit:
    check = DecoderProcess(limit_seconds)(Role.IMAGE, body, key, config)   # check_image in the child
    ... keep `check` in the ledger until the partner lands, then:
    result = judge_pair(stem, image_check, label_check, taxonomy=config.taxonomy, index=index)
A whole batch or manifest (the CLI, the sweeper):
    validate_batch(keys, reader, config=..., index=...)
    validate_manifest(lines, name, reader, config=..., index=...)
"""

from functions.validation.config import DEFAULT_CONFIG, ValidationConfig
from functions.validation.decoder_process import (
    DecoderProcess,
    DecoderUnavailableError,
    FileChecker,
    check_in_process,
    keep_from_children,
)
from functions.validation.decoding import Readable, Source, StrictDecodingDisabledError
from functions.validation.duplicates import ContentIndex, InMemoryContentIndex
from functions.validation.groundtruth import (
    GroundTruthEntry,
    check_groundtruth_label,
    parse_entry,
    validate_entry,
    validate_manifest,
)
from functions.validation.images import check_image
from functions.validation.masks import check_label
from functions.validation.names import (
    BatchKey,
    KeyKind,
    check_batch_safety,
    check_key_safety,
    check_landing_key,
    classify_key,
)
from functions.validation.pairs import (
    PlannedItem,
    judge_pair,
    missing,
    plan_pairs,
    validate_batch,
    validate_pair,
    validate_planned,
)
from functions.validation.reasons import DESCRIPTIONS, ReasonCode, RejectedError
from functions.validation.results import FileCheck, PairResult, Reason, Role, Status
from functions.validation.sources import (
    BatchReader,
    LocalBatchReader,
    LocalMirrorReader,
    ObjectMissingError,
    S3Location,
    SourceReader,
)

__all__ = [
    "DEFAULT_CONFIG",
    "DESCRIPTIONS",
    "BatchKey",
    "BatchReader",
    "ContentIndex",
    "DecoderProcess",
    "DecoderUnavailableError",
    "FileCheck",
    "FileChecker",
    "GroundTruthEntry",
    "InMemoryContentIndex",
    "KeyKind",
    "LocalBatchReader",
    "LocalMirrorReader",
    "ObjectMissingError",
    "PairResult",
    "PlannedItem",
    "Readable",
    "Reason",
    "ReasonCode",
    "RejectedError",
    "Role",
    "S3Location",
    "Source",
    "SourceReader",
    "Status",
    "StrictDecodingDisabledError",
    "ValidationConfig",
    "check_batch_safety",
    "check_groundtruth_label",
    "check_image",
    "check_in_process",
    "check_key_safety",
    "check_label",
    "check_landing_key",
    "classify_key",
    "judge_pair",
    "keep_from_children",
    "missing",
    "parse_entry",
    "plan_pairs",
    "validate_batch",
    "validate_entry",
    "validate_manifest",
    "validate_pair",
    "validate_planned",
]
