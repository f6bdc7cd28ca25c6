"""What the intake and the sweeper both do to a batch's files: carry out and record their fates.

A file set aside is copied to quarantine beside a `.reason.json`, and only then removed from the
landing zone; one that cannot be moved (too large, or encrypted with a key the intake cannot use)
is refused: left where it is, its `.reason.json` in quarantine all the same. Every fate is one
ledger record per object version. A batch closes once (by its `_COMPLETE` marker or after a quiet
period), and the reports of the closed batches an invocation touched are rewritten at its end,
when the trigger is also asked to look at what closed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from functions.common import prefixes
from functions.common.errors import EncryptionRefusedError, ObjectTooLargeError
from functions.data.ledger import Ledger
from functions.data.models import BatchStatus, FileRecord, FileStatus
from functions.data.reports import write_report
from functions.data.storage import DataBucket
from functions.validation import DEFAULT_CONFIG, FileCheck, Reason, ReasonCode, Role


def utc_now() -> datetime:
    return datetime.now(UTC)


def unmovable_reason(error: EncryptionRefusedError | ObjectTooLargeError, key: str) -> Reason:
    """Why an upload was left in incoming/, and what its uploader can do about it."""
    if isinstance(error, ObjectTooLargeError):
        return Reason(
            code=ReasonCode.FILE_TOO_LARGE,
            key=key,
            message=(
                f"{error.size} bytes, over the limit of {error.limit}: too large to move to quarantine, it is "
                f"left in incoming/ untouched; delete it, and upload files of at most {error.limit} bytes"
            ),
        )
    return Reason(
        code=ReasonCode.ENCRYPTION_NOT_ACCEPTED,
        key=key,
        message=(
            f"{error.problem}: the bucket takes only its own KMS key, so it is left in incoming/ untouched; "
            "upload it again without encryption headers (the bucket then encrypts it with that key)"
        ),
    )


def wait_for_the_schedule(reason: str) -> None:
    """No trigger to kick: it looks on its schedule (`TriggerKick` asks it to look now)."""


@dataclass(kw_only=True)
class Bookkeeper:
    ledger: Ledger
    bucket: DataBucket
    clock: Callable[[], datetime] = utc_now
    # Asks the trigger to look now, with the reason (`functions/trigger/kick.py`).
    kick: Callable[[str], None] = wait_for_the_schedule
    touched: set[str] = field(default_factory=set)  # batches this invocation worked on
    newly_closed: set[str] = field(default_factory=set)

    def report_closed(self) -> list[str]:
        """Rewrite the report of every closed batch this invocation touched; those batches."""
        reported = []
        for batch in sorted(self.touched | self.newly_closed):
            found = self.ledger.batch(batch)
            if found is not None and found[0].status is BatchStatus.CLOSED:
                write_report(batch, self.ledger, self.bucket)
                reported.append(batch)
        return reported

    def _close(self, batch: str, reason: str) -> None:
        found = self.ledger.batch(batch)
        if found is None or found[0].status is BatchStatus.CLOSED:
            return
        record, revision = found
        closed = record.model_copy(
            update={"status": BatchStatus.CLOSED, "closed_at": self.clock(), "close_reason": reason}
        )
        self.ledger.close_batch(closed, revision)
        self.newly_closed.add(batch)

    # -------------------------------------------------------- quarantine --
    def _move_limit(self) -> int:
        """The largest object set aside by copying it (the validation limit: nothing the intake
        could accept is larger, and a copy of at most this finishes in seconds)."""
        return DEFAULT_CONFIG.max_file_bytes

    def _quarantine(
        self,
        batch: str,
        key: str,
        version: str,
        reasons: list[Reason],
        *,
        status: FileStatus = FileStatus.QUARANTINED,
        role: Role | None = None,
        check: FileCheck | None = None,
        duplicate_of: str | None = None,
        destination: str | None = None,
    ) -> FileStatus:
        """Move one version to quarantine, beside a `.reason.json`; `destination` where its own
        name is not to be reused (`prefixes.unsafe_quarantine_key`). The fate recorded: `status`,
        or `refused` for a version that cannot be moved (see `_refuse`)."""
        destination = destination or prefixes.quarantine_key(batch, prefixes.relative_to_batch(key))
        try:
            copied = self.bucket.copy(
                key, None if version == "null" else version, destination, max_bytes=self._move_limit()
            )
        except (EncryptionRefusedError, ObjectTooLargeError) as unmovable:
            self._refuse(
                batch, key, version, reasons, unmovable=unmovable, destination=destination, role=role, check=check
            )
            return FileStatus.REFUSED
        self._write_reason(
            destination, key=key, version=version, status=status, reasons=reasons, duplicate_of=duplicate_of
        )
        self.bucket.remove(key, version)  # only now: the copy above is confirmed
        self._record(
            batch,
            key,
            version,
            status,
            role=role,
            check=check,
            reasons=tuple(reasons),
            destination=destination,
            destination_version=copied,
            duplicate_of=duplicate_of,
        )
        return status

    def _refuse(
        self,
        batch: str,
        key: str,
        version: str,
        reasons: list[Reason],
        *,
        unmovable: EncryptionRefusedError | ObjectTooLargeError,
        destination: str,
        role: Role | None,
        check: FileCheck | None,
    ) -> None:
        """A rejected version that cannot be moved stays in incoming/, untouched, and is recorded
        `refused`; its `.reason.json` goes where its copy would have gone, saying why and what the
        uploader can do. Copying up to 5 TB in parts would outlast the function, and an object we
        cannot decrypt cannot be copied at all: either way every retry would fail the same, and
        the message would end in the DLQ with no word to the uploader."""
        left = unmovable_reason(unmovable, prefixes.relative_to_batch(key))
        reasons = [r for r in reasons if r.code is not left.code] + [left]
        where = prefixes.reason_key(destination)
        self._write_reason(
            destination, key=key, version=version, status=FileStatus.REFUSED, reasons=reasons, duplicate_of=None
        )
        self._record(
            batch, key, version, FileStatus.REFUSED, role=role, check=check, reasons=tuple(reasons), reason_key=where
        )

    def _write_reason(
        self,
        destination: str,
        *,
        key: str,
        version: str,
        status: FileStatus,
        reasons: list[Reason],
        duplicate_of: str | None,
    ) -> None:
        self.bucket.put_json(
            prefixes.reason_key(destination),
            {
                "key": key,
                "version": version,
                "status": status.value,
                "reasons": [reason.model_dump(mode="json") for reason in reasons],
                "duplicate_of": duplicate_of,
                "quarantined_at": self.clock().isoformat(),
            },
        )

    # ------------------------------------------------------------ ledger --
    def _record(
        self,
        batch: str,
        key: str,
        version: str,
        status: FileStatus,
        *,
        role: Role | None = None,
        check: FileCheck | None = None,
        **details: Any,
    ) -> None:
        self.ledger.put_file(
            FileRecord(
                batch=batch,
                key=key,
                version=version,
                status=status,
                role=role,
                sha256=check.sha256 if check else None,
                recorded_at=self.clock(),
                **details,
            )
        )
