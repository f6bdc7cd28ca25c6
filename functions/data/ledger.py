"""The ledger in DynamoDB: the only code that knows its item layout (see models.py).

One table holds every kind of record; `Ledger` is all of them, each kind's items in its own
module: batches and the run lock (`ledger_batches.py`), pairs, files and content claims
(`ledger_pairs.py`), batches' trust (`ledger_trust.py`), runs' training jobs and the waits
for them (`ledger_jobs.py`), runs' ends and their one message (`ledger_run_ends.py`), and what
they share, records as items and conditional writes (`ledger_table.py`).
"""

from __future__ import annotations

from functions.data.ledger_batches import BatchItems
from functions.data.ledger_jobs import JobItems
from functions.data.ledger_pairs import PairItems
from functions.data.ledger_run_ends import RunEndItems
from functions.data.ledger_trust import TrustItems


class Ledger(BatchItems, PairItems, TrustItems, JobItems, RunEndItems):
    """The ledger table, as the functions and the operator tools use it."""
