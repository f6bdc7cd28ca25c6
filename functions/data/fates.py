"""What the intake and the sweeper both do to a batch's files: carry out and record their fates.

A file set aside is copied to quarantine beside a `.reason.json`, and only then removed from the
landing zone; every fate is one ledger record per object version. A batch closes once (by its
`_COMPLETE` marker or after a quiet period), and the reports of the closed batches an invocation
touched are rewritten at its end, when the trigger is also asked to look at what closed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from functions.common import prefixes
from functions.data.ledger import Ledger
from functions.data.models import BatchStatus, FileRecord, FileStatus
from functions.data.reports import write_report
from functions.data.storage import DataBucket
from functions.validation import FileCheck, Reason, Role


def utc_now() -> datetime:
    return datetime.now(UTC)


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
    ) -> None:
        """Move one version to quarantine, beside a `.reason.json`; `destination` where its own
        name is not to be reused (`prefixes.unsafe_quarantine_key`)."""
        destination = destination or prefixes.quarantine_key(batch, prefixes.relative_to_batch(key))
        copied = self.bucket.copy(key, None if version == "null" else version, destination)
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
